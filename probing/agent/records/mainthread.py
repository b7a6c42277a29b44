"""Run a function in the main thread: signal handlers can be set only there.

With PROBING=1 (or `probing run`) the agent starts in the main thread and sets them at once.
An agent attached later runs in its own thread: it asks the interpreter to call the function
from the main thread at its next bytecode boundary (`Py_AddPendingCall`, through ctypes), the
same place where Python runs its own signal handlers. A main thread stuck in C runs it when it
comes back, which is also when it would run any Python signal handler, the job's included.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List

# ctypes callbacks must outlive their call, and one must never be freed while it runs: kept
# for the life of the process (one or two per attach).
_keep: List[Any] = []


def in_main_thread(function: Callable[[], None]) -> str:
    """Call `function` in the main thread: now if this is it, else soon. Returns 'now',
    'scheduled', or why it cannot be done; `function` must not raise."""
    if threading.current_thread() is threading.main_thread():
        function()
        return "now"
    try:
        import ctypes

        callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)

        def run(_: Any) -> int:
            if threading.current_thread() is threading.main_thread():
                function()
            return 0

        callback = callback_type(run)
        add = ctypes.pythonapi.Py_AddPendingCall
        add.argtypes = [callback_type, ctypes.c_void_p]
        add.restype = ctypes.c_int
        _keep.append(callback)
        if add(callback, None) != 0:
            return "the interpreter's queue of pending calls is full"
    except Exception as error:  # noqa: BLE001 - no ctypes (a minimal build): say so
        return f"cannot reach the main thread ({type(error).__name__}: {error})"
    return "scheduled"
