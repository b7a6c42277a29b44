"""Raising an exception in another thread of the job: how eval's timeout and the repl's Ctrl-C
stop code that runs in a thread of its own."""

from __future__ import annotations

import ctypes
from typing import Optional


def set_async_exception(ident: int, exception: Optional[type]) -> None:
    """Raise `exception` in thread `ident` at its next bytecode; None withdraws a pending one.

    A blocking C call (time.sleep, a lock) is interrupted only when it returns to Python."""
    pending = ctypes.py_object(exception) if exception is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), pending)
