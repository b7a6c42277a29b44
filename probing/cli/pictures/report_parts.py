"""Pieces of the report page that its sections share: numbers and times as text, a table, a
section. Cells and leads they take are HTML already (text() or formatted numbers)."""

from __future__ import annotations

import math
import time
from typing import Any, List, Optional, Sequence

from .page import text


def seconds(value: Optional[float]) -> str:
    if value is None:
        return "?"
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.1f} ms"


# time.gmtime's range on every platform this runs on: year 9999 at most.
LATEST_EPOCH = 253402300800


def utc(epoch: Optional[float]) -> str:
    """A time as UTC; "?" for one a record header could hold that is no time (NaN, 1e300, < 0)."""
    if not isinstance(epoch, (int, float)) or not math.isfinite(epoch) or not 0 <= epoch < LATEST_EPOCH:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def number(value: Any) -> str:
    return "" if value is None else f"{value:,}" if isinstance(value, int) else text(value)


def table(header: Sequence[str], rows: List[List[str]], numeric: Sequence[bool]) -> str:
    """A table of cells already made HTML (text() or formatted numbers)."""
    head = "".join(f'<th class="num">{text(h)}</th>' if n else f"<th>{text(h)}</th>"
                   for h, n in zip(header, numeric))  # fmt: skip
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{cell}</td>' if n else f'<td class="name">{cell}</td>'
            for cell, n in zip(row, numeric)
        )
        + "</tr>"  # fmt: skip
        for row in rows
    )
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def section(element_id: str, title: str, lead: str, content: str) -> str:
    lead_html = f'<p class="lead">{lead}</p>' if lead else ""
    return f'<section id="{element_id}"><h2>{text(title)}</h2>{lead_html}{content}</section>'
