"""The hooks that see a job end: sys.excepthook, threading.excepthook, and SIGTERM, SIGINT and
SIGHUP. Each writes a record (through `on_exception` / `on_signal` of its owner), then does
exactly what would have happened without probing: the job's own hook or handler, or Python's
default. Nothing here runs while the job is healthy.

Signals. Python runs a signal's handler in the main thread between bytecodes; ours records,
then calls the job's handler, or for SIG_DFL restores the default action and sends the signal
again, so the job dies of it as it would have (its exit status says so). A signal the job
ignores (SIG_IGN) or handles in C (getsignal() is None) is left alone. A job that sets its own
handler after the agent started must still have it run, and must still see it from
getsignal(): `signal.signal` and `signal.getsignal` are wrapped for the three signals, so the
job's handler is kept as the one ours hands over to, and getsignal() answers the job's. Code
that calls the C `sigaction` directly bypasses this: its handler runs alone, with no record.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any, Callable, Dict, List, Optional, Type

from .mainthread import cancel, in_main_thread

HOOKED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_MARK = "_probing_record"


def mark(error: BaseException) -> None:
    """This exception has a record: later hooks (threading's, atexit) do not write another."""
    try:
        setattr(error, _MARK, True)
    except Exception:  # noqa: BLE001, S110 - an exception type that refuses attributes
        pass


def marked(error: BaseException) -> bool:
    try:
        return bool(getattr(error, _MARK, False))
    except Exception:  # noqa: BLE001 - a hostile __getattr__
        return False


class ExceptionHooks:
    """sys.excepthook and threading.excepthook, chained to the job's."""

    def __init__(self, on_exception: Callable[[BaseException, threading.Thread], None]) -> None:
        self.on_exception = on_exception
        self.active = False
        self.previous_excepthook: Any = None
        self.previous_thread_hook: Any = None

    def install(self) -> None:
        self.previous_excepthook = sys.excepthook
        self.previous_thread_hook = threading.excepthook
        sys.excepthook = self.excepthook
        threading.excepthook = self.thread_excepthook
        self.active = True

    def excepthook(
        self, kind: Type[BaseException], value: BaseException, tb: Optional[TracebackType]
    ) -> None:
        try:
            if self.active and value is not None and not marked(value):
                self.on_exception(value, threading.current_thread())
        except Exception:  # noqa: BLE001, S110 - the job's exception is reported as ever, whatever ours did
            pass
        finally:
            # The job's hook (or Python's) prints the traceback as it always did.
            (self.previous_excepthook or sys.__excepthook__)(kind, value, tb)

    def thread_excepthook(self, args: Any) -> None:
        try:
            value = args.exc_value
            thread = args.thread if args.thread is not None else threading.current_thread()
            if self.active and value is not None and not isinstance(value, SystemExit) and not marked(value):
                self.on_exception(value, thread)
        except Exception:  # noqa: BLE001, S110 - as above
            pass
        finally:
            (self.previous_thread_hook or threading.__excepthook__)(args)

    def uninstall(self) -> None:
        """Put the job's hooks back where ours still is; a hook the job set since stays. One
        the job wrapped around ours keeps calling ours, which now only passes on."""
        self.active = False
        if sys.excepthook == self.excepthook:
            sys.excepthook = self.previous_excepthook
        if threading.excepthook == self.thread_excepthook:
            threading.excepthook = self.previous_thread_hook


class SignalHooks:
    """Our handler in front of the job's for SIGTERM, SIGINT and SIGHUP."""

    def __init__(self, on_signal: Callable[[int, Optional[FrameType]], None]) -> None:
        self.on_signal = on_signal
        self.active = False
        # What the job set (or inherited) for each signal we hook: what ours hands over to.
        self.job_handlers: Dict[int, Any] = {}
        self.original_signal: Any = signal.signal
        self.original_getsignal: Any = signal.getsignal
        self.notes: List[str] = []

    def install(self) -> str:
        """Install from the main thread (now, or soon when attached); 'now', 'scheduled' or why not."""
        self.active = True
        return in_main_thread(self._install_here)

    def _install_here(self) -> None:
        if not self.active:
            return  # detached before the main thread got to it
        for signum in HOOKED_SIGNALS:
            current = self.original_getsignal(signum)
            if current is None:
                self.notes.append(f"{signal.Signals(signum).name}: handled in C by the job; no record for it")
                continue
            if current == signal.SIG_IGN:
                continue  # the job ignores it (nohup): it ends nothing
            try:
                self.original_signal(signum, self.handler)
            except (OSError, ValueError, RuntimeError) as error:
                self.notes.append(f"{signal.Signals(signum).name}: not hooked ({error})")
                continue
            self.job_handlers[signum] = current
        if self.job_handlers:
            signal.signal = self.job_signal
            signal.getsignal = self.job_getsignal

    def handler(self, signum: int, frame: Optional[FrameType]) -> Any:
        if self.active:
            try:
                self.on_signal(signum, frame)
            except Exception:  # noqa: BLE001, S110 - the job's handler runs whatever happened
                pass
        job_handler = self.job_handlers.get(signum, signal.SIG_DFL)
        if callable(job_handler):
            return job_handler(signum, frame)
        if job_handler == signal.SIG_IGN:
            return None
        # SIG_DFL: the default action, as if we had never been here (the process ends of it).
        self.original_signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return None

    def job_signal(self, signalnum: Any, handler: Any) -> Any:
        """signal.signal as the job calls it: for our signals, the job's handler goes behind ours."""
        if signalnum not in self.job_handlers or not self.active:
            return self.original_signal(signalnum, handler)
        previous = self.job_handlers[signalnum]
        # Installed first as the job asked: the same checks (main thread, a callable) and errors.
        self.original_signal(signalnum, handler)
        self.job_handlers[signalnum] = handler
        if handler != signal.SIG_IGN:
            self.original_signal(signalnum, self.handler)
        return previous

    def job_getsignal(self, signalnum: Any) -> Any:
        if signalnum in self.job_handlers and self.active:
            return self.job_handlers[signalnum]
        return self.original_getsignal(signalnum)

    def uninstall(self, in_child: bool = False) -> None:
        """The job's handlers back, as getsignal() said they were. From another thread the
        handlers are put back by the main thread soon; until then ours only passes on."""
        self.active = False
        if signal.signal == self.job_signal:
            signal.signal = self.original_signal
        if signal.getsignal == self.job_getsignal:
            signal.getsignal = self.original_getsignal
        if cancel(self._install_here):
            return  # the main thread never got to install them: nothing to put back
        if in_child:
            self._restore_here()  # after fork the forking thread is the child's main thread
        elif self.job_handlers:
            in_main_thread(self._restore_here)

    def _restore_here(self) -> None:
        for signum, job_handler in list(self.job_handlers.items()):
            try:
                if self.original_getsignal(signum) == self.handler:
                    self.original_signal(signum, job_handler)
            except (OSError, ValueError, RuntimeError, TypeError):
                pass
        self.job_handlers = {}
