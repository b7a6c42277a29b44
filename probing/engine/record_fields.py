"""A field of something a job wrote (a record's header, an agent's reply), taken only if it
has the type the reader expects: None (or empty) otherwise, never a value of another type.
bool is not a number here, though Python makes it an int: `{"pid": true}` is no PID."""

from __future__ import annotations

from typing import Any, List, Optional


def integer(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def texts(value: Any) -> List[str]:
    """The strings of a list (what is not a string is left out)."""
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def is_texts(value: Any) -> bool:
    """Whether `value` is a list of strings and nothing else."""
    return isinstance(value, list) and all(isinstance(item, str) for item in value)
