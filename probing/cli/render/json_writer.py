"""The one JSON writer: every `--format json` (and jsonl) of every command goes through here.

JSON has no NaN or Infinity: json.dumps would write tokens that jq and most parsers reject, so
they become null, at any depth. Values JSON lacks (timestamps, decimals, bytes) become the text
or number people expect.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import sys
from typing import IO, Any, Optional


def json_default(value: Any) -> Any:
    """What json.dumps writes for a value it has no type for."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return finite(float(value))
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return str(value)


def finite(value: Any) -> Any:
    """`value` with every NaN and infinity, however deep, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value: Any, indent: Optional[int] = None) -> str:
    return json.dumps(finite(value), default=json_default, indent=indent, allow_nan=False)


def write_json(value: Any, out: Optional[IO[str]] = None, indent: Optional[int] = 2) -> None:
    """`value` as one JSON document and a newline (to stdout unless `out`)."""
    (out or sys.stdout).write(dumps(value, indent) + "\n")


def write_json_lines(values: Any, out: Optional[IO[str]] = None) -> None:
    """One JSON document per line (jsonl)."""
    stream = out or sys.stdout
    for value in values:
        stream.write(dumps(value) + "\n")
