"""A field of something a job wrote (a record's header, an agent's reply), taken only if it
has the type the reader expects: None (or empty) otherwise, never a value of another type.
bool is not a number here, though Python makes it an int: `{"pid": true}` is no PID; a number is
finite, and a time is one a clock could show."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, List, Optional

if TYPE_CHECKING:  # what a record's header says of the job's end and rank (records/record.py)
    from typing import TypedDict

    class Reason(TypedDict):
        """Why a record was written; each None where the header does not say."""

        kind: Optional[str]
        message: str
        signal: Optional[int]
        exit_status: Optional[int]

    class EndingException(TypedDict):
        """The exception that ended the job, as the header holds it."""

        type: Optional[str]
        message: Optional[str]
        text: Optional[str]
        thread: Optional[str]

    class RankOf(TypedDict):
        """The rank the job's process was, as the header holds it."""

        rank: Optional[int]
        local_rank: Optional[int]
        world_size: Optional[int]
        node: Optional[int]


# 9999-12-31 23:59:59 UTC: the last second datetime (and so DuckDB's results in Python) can hold.
LATEST_TIME_S = 253402300799.0


def integer(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: Any) -> Optional[float]:
    """A finite number as a float: NaN, an infinity, and an integer too large for a float (JSON
    allows `1e999` and a 400-digit integer) are no number a reader can use."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        converted = float(value)
    except OverflowError:
        return None
    return converted if math.isfinite(converted) else None


def timestamp(value: Any) -> Optional[float]:
    """Seconds since the epoch that are a time: from 1970 to the end of year 9999, the range
    time.localtime, strftime and datetime all take (1e30 is a number, and no time)."""
    seconds = number(value)
    return seconds if seconds is not None and 0.0 <= seconds <= LATEST_TIME_S else None


def text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def texts(value: Any) -> List[str]:
    """The strings of a list (what is not a string is left out)."""
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def is_texts(value: Any) -> bool:
    """Whether `value` is a list of strings and nothing else."""
    return isinstance(value, list) and all(isinstance(item, str) for item in value)
