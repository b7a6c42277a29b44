"""Whether a table an agent sent (or a record holds) has the column types of probing's table of
that name: the renderers read a known table's columns as their schema types (rss_mb a number,
file a string), so a column of another type must be refused before any of them reads it.
Standard library only and Python 3.8 syntax, as the rest of schema/."""

from __future__ import annotations

from .tables import AGENT_TABLES

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs `probing PID backtrace` start-up (docs/decisions.md)
    from typing import Iterable, Optional, Tuple


def mismatched_column(table: str, columns: Iterable[Tuple[str, str]]) -> Optional[str]:
    """What is wrong with table `table` whose columns are these (name, type) pairs, or None.
    A table this probing does not know, and a column its schema does not name, pass: a newer
    agent may send them, and nothing here reads them by type."""
    known = AGENT_TABLES.get(table)
    if known is None:
        return None
    expected = dict(known.column_types())
    for name, type in columns:
        wanted = expected.get(name)
        if wanted is not None and type != wanted:
            return f"table {table}: column {name!r} is {type}, not {wanted} as probing's schema says"
    return None
