"""Raising an exception in another thread of the job: how eval's timeout and the repl's Ctrl-C
stop code that runs in a thread of its own."""

from __future__ import annotations

import ctypes
from typing import Optional

from ...originals import allocate_lock


def set_async_exception(ident: int, exception: Optional[type]) -> None:
    """Raise `exception` in thread `ident` at its next bytecode; None withdraws a pending one.

    A blocking C call (time.sleep, a lock) is interrupted only when it returns to Python."""
    pending = ctypes.py_object(exception) if exception is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), pending)


class Interruptible:
    """Code run in a thread of its own (an eval, a repl statement) that another thread may
    interrupt. Interrupts go out under a lock and only until the code has finished: the thread's
    ident may be reused by a thread of the job once it has ended, and one sent just before the
    end is withdrawn."""

    interrupt_with: type = KeyboardInterrupt

    def __init__(self) -> None:
        self._lock = allocate_lock()
        self._finished = False
        self._started = False
        self._sent = False

    def running_ident(self) -> Optional[int]:
        """The ident of the thread that runs the code; None before it has started."""
        raise NotImplementedError

    def _execute(self, ident: int) -> None:
        """Run the code, in thread `ident`."""
        raise NotImplementedError

    def _escaped(self, error: BaseException) -> None:
        """An interrupt that landed outside the code (after it ended, before _finish)."""

    def _run_to_the_end(self, ident: int) -> None:
        """Run the code once, then stop interrupts. An interrupt can land anywhere until
        _finish has run, even outside the code: go round until it has. One escaping the
        thread would reach the job's hooks (threads.py keeps it from them, silently)."""
        while True:
            try:
                if not self._started:
                    self._started = True
                    self._execute(ident)
                self._finish(ident)
                return
            except BaseException as error:  # noqa: BLE001 - an interrupt outside the code
                self._escaped(error)

    def _finish(self, ident: int) -> None:
        # From here on no interrupt is sent. One sent just before is taken here, in this thread,
        # rather than withdrawn: CPython up to 3.11 signals every thread's eval loop for a
        # withdrawal too (PyThreadState_SetAsyncExc with NULL) and clears that signal only when a
        # thread takes a pending exception. Left set, every thread of the job handles "pending"
        # at each call and loop; on 3.11 a traced frame then spins at its first instruction (a
        # job that used threading.settrace hung after an eval that timed out).
        with self._lock:
            self._finished = True
            sent = self._sent
        if sent:
            # A backward jump checks for pending work at every CPython: an interrupt still
            # pending is raised here and caught by _run_to_the_end, which calls _finish again.
            for _ in range(4):
                pass

    def interrupt(self) -> bool:
        """Raise `interrupt_with` in the code; False when it has ended (or not begun)."""
        with self._lock:
            ident = self.running_ident()
            if self._finished or ident is None:
                return False
            self._interrupted()
            self._sent = True
            set_async_exception(ident, self.interrupt_with)
            return True

    def _interrupted(self) -> None:
        """Called, under the lock, as an interrupt goes out."""
