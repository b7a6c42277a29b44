"""What a request may carry and how one fails: the parameter checks every method shares, and
the RequestError that becomes an error reply.

A leaf of the agent: the dispatcher (handlers.py) and every feature (evaluate, repl, memory,
pytorch) raise RequestError without importing the dispatcher that catches it.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from ..protocol.messages import ErrorKind

__all__ = ["ErrorKind", "RequestError", "bool_param", "float_param", "int_param", "str_param", "type_name"]


class RequestError(Exception):
    """A request that cannot be served; becomes `{ok: false, error: {type, message, ...}}`.

    `error_type` is one of protocol.messages.ErrorKind; `details` go into the error object, but
    a `payload` detail (eval's texts) travels in the frame's payload.
    """

    def __init__(self, error_type: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.details = details


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def bool_param(params: Dict[str, Any], name: str) -> bool:
    value = params.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(
            ErrorKind.BAD_REQUEST, f"{name} must be true or false, not {type_name(value)} {value!r:.80}"
        )
    return value


def str_param(params: Dict[str, Any], name: str) -> Optional[str]:
    value = params.get(name)
    if value is not None and not isinstance(value, str):
        raise RequestError(
            ErrorKind.BAD_REQUEST, f"{name} must be a string, not {type_name(value)} {value!r:.80}"
        )
    return value


def int_param(params: Dict[str, Any], name: str, low: int) -> Optional[int]:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RequestError(ErrorKind.BAD_REQUEST, f"{name} must be an integer >= {low}, not {value!r:.80}")
    return value


def float_param(params: Dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = params.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(
            ErrorKind.BAD_REQUEST, f"{name} must be a number from {low:g} to {high:g}, not {value!r:.80}"
        )
    return float(value)
