"""Run a function in the main thread: signal handlers can be set only there.

With PROBING=1 (or `probing run`) the agent starts in the main thread and sets them at once.
An agent attached later runs in its own thread: it asks the interpreter to call the function
from the main thread at its next bytecode boundary (`Py_AddPendingCall`, through ctypes), the
same place where Python runs its own signal handlers. A main thread stuck in C (or blocked
reading stdin) runs it when it comes back, which is also when it would run any Python signal
handler, the job's included.

One ctypes callback serves the process, made once and kept (one must never be freed while it
may still run), and at most one pending call is queued at a time; the functions wait in
`_queue`. A function that has not run yet can be taken back (`cancel`): an agent attached and
detached fifty times to a job whose main thread never runs Python queues nothing.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

_lock = threading.Lock()
_queue: List[Callable[[], None]] = []
_pending = False
_callback: Optional[Any] = None


def _run_queue(_: Any) -> int:
    global _pending
    if threading.current_thread() is not threading.main_thread():
        return 0  # an interpreter that runs pending calls elsewhere: left queued, never run here
    with _lock:
        functions = list(_queue)
        del _queue[:]
        _pending = False
    for function in functions:
        try:
            function()
        except Exception:  # noqa: BLE001, S110 - a pending call must not raise into the job
            pass
    return 0


def _schedule() -> Optional[str]:
    """Queue the one pending call (the lock is held); why it could not be, or None."""
    global _pending, _callback
    if _pending:
        return None
    try:
        import ctypes

        callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
        if _callback is None:
            _callback = callback_type(_run_queue)
        add = ctypes.pythonapi.Py_AddPendingCall
        add.argtypes = [callback_type, ctypes.c_void_p]
        add.restype = ctypes.c_int
        if add(_callback, None) != 0:
            return "the interpreter's queue of pending calls is full"
    except Exception as error:  # noqa: BLE001 - no ctypes (a minimal build): say so
        return f"cannot reach the main thread ({type(error).__name__}: {error})"
    _pending = True
    return None


def in_main_thread(function: Callable[[], None]) -> str:
    """Call `function` in the main thread: now if this is it, else soon. Returns 'now',
    'scheduled', or why it cannot be done; `function` must not raise."""
    if threading.current_thread() is threading.main_thread():
        function()
        return "now"
    with _lock:
        problem = _schedule()
        if problem is not None:
            return problem
        _queue.append(function)
    return "scheduled"


def cancel(function: Callable[[], None]) -> bool:
    """Take `function` back if the main thread has not run it yet; whether it was still queued."""
    with _lock:
        for index, queued in enumerate(_queue):
            if queued == function:
                del _queue[index]
                return True
    return False


def forget_after_fork() -> None:
    """In a forked child: the parent's queue and its pending call are not the child's."""
    global _lock, _pending
    _lock = threading.Lock()
    del _queue[:]
    _pending = False
