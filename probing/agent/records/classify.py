"""Why a job ended, from the exception that ended it: the reason's kind and the exception's
description in a record's header. Pure functions of the exception object."""

from __future__ import annotations

import re
import traceback
from typing import Any, Dict, List, Optional

# How much of an exception's text a header keeps (a message can be megabytes).
MAX_MESSAGE_CHARS = 4000
MAX_TRACEBACK_CHARS = 50_000

# Collective timeouts as torch raises them: NCCL's watchdog ("Watchdog caught collective
# operation timeout: WorkNCCL(...) ran for 600000 milliseconds before timing out") and gloo's
# transport, which in torch 2.13 raises a plain RuntimeError ("[.../gloo/transport/tcp/
# unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation to complete").
_TIMEOUT_WORDS = re.compile(r"timed out|timeout|timing out", re.IGNORECASE)
_COLLECTIVE_WORDS = re.compile(
    r"gloo|nccl|c10d|ProcessGroup|collective|Work[A-Z]\w*\(|(?:recv|send) operation|all_?reduce|barrier",
    re.IGNORECASE,
)
_DISTRIBUTED_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError", "DistError")
_NONFINITE_TYPE = "NonFiniteError"


def type_name(kind: type) -> str:
    module = getattr(kind, "__module__", None) or "builtins"
    return f"{module}.{kind.__qualname__}"


def reason_kind(error: BaseException) -> str:
    """'nan', 'collective_timeout' or 'exception'."""
    names = [kind.__name__ for kind in type(error).__mro__]
    if _NONFINITE_TYPE in names:
        return "nan"
    message = _text(error)
    if _TIMEOUT_WORDS.search(message) and (
        any(name in _DISTRIBUTED_TYPES for name in names) or _COLLECTIVE_WORDS.search(message)
    ):
        return "collective_timeout"
    return "exception"


def _text(error: BaseException) -> str:
    try:
        return str(error)[:MAX_MESSAGE_CHARS]
    except Exception:  # noqa: BLE001 - a job's __str__ may raise; its record must not fail
        return f"<{type(error).__name__}: str() raised>"


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]} [probing: {len(text) - limit} more characters were dropped]"


def describe(error: BaseException, thread_name: str) -> Dict[str, Any]:
    """The header's `exception`: type, message, the traceback as Python prints it, frames."""
    try:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    except Exception:  # noqa: BLE001 - a broken __str__ inside a chained exception
        text = f"{type_name(type(error))}: {_text(error)}\n"
    frames: List[Dict[str, Any]] = []
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append({"file": code.co_filename, "lineno": tb.tb_lineno, "func": code.co_name})
        tb = tb.tb_next
    return {
        "type": type_name(type(error)),
        "message": _text(error),
        "text": _cut(text, MAX_TRACEBACK_CHARS),
        "thread": thread_name,
        "frames": frames,
    }


def headline(error: BaseException) -> str:
    """'ValueError: bad step' for a reason's message."""
    message = _text(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def exit_status(error: Optional[BaseException]) -> Optional[int]:
    """The status an uncaught exception gives the process: 1, except SystemExit and
    KeyboardInterrupt (which Python ends with SIGINT: -2 as Popen says it)."""
    if error is None:
        return None
    if isinstance(error, KeyboardInterrupt):
        return -2
    if isinstance(error, SystemExit):
        code = error.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    return 1
