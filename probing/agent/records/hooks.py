"""The hooks that see a job end: sys.excepthook, threading.excepthook, and SIGTERM, SIGINT and
SIGHUP. Each records (through `on_exception` / `on_signal` of its owner), then does what would
have happened without probing: the job's own hook or handler, or Python's default. Nothing
here runs while the job is healthy.

Signals, by what the job has for them:
- SIGTERM or SIGHUP with the default action: no Python handler (one would run only when the
  main thread next runs bytecode: a job stuck in NCCL or a CUDA sync would never die of it).
  faulthandler.register puts a C handler there that writes the interrupted thread's stack (the
  main thread's, as a rule) into the `.fatal` file (without the GIL), puts the default action
  back and raises the signal again, so the job dies of it at once. It may be called from any
  thread: an attached agent does it too.
- SIGINT with Python's default_int_handler: left alone; the KeyboardInterrupt that ends the job
  is recorded by the excepthook.
- The job's own Python handler: ours goes in front of it, starts the record in a thread of its
  own and waits for it at most SIGNAL_RECORD_WAIT_S, then calls the job's handler whatever
  happened, so a lock the interrupted main thread holds, or a stuck device, can delay the
  job's handler by that much and never more. Python handlers can be set only in the main
  thread: only an agent started there (PROBING=1, `probing run`) does this, and wraps
  `signal.signal` / `signal.getsignal` so that a handler the job sets later goes behind ours and
  getsignal() still answers the job's.
- SIG_IGN, or a handler in C (getsignal() is None): left alone.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any, Callable, Dict, List, Optional, Set, Type

from ..threads import job_thread, on_main_thread

HOOKED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Those whose default action ends the job without Python: their stacks go to the .fatal file.
DUMPED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
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


def _called_by_python_itself(value: BaseException) -> bool:
    """Whether the hook runs because `value` ended the program: sys.last_value is it, and the
    outermost frame is the installed sys.excepthook's own, called from C (ours, or a job's
    hook that wraps ours, as Sentry or wandb do). A console that calls the hook from its own
    code has its loop's frames below."""
    if getattr(sys, "last_value", None) is not value:
        return False
    try:
        frame = sys._getframe(1)
    except ValueError:
        return False
    while frame.f_back is not None:
        frame = frame.f_back
    hook = sys.excepthook
    # A function, a bound method, or an object whose class defines __call__.
    callables = (hook, getattr(hook, "__func__", None), type(hook).__dict__.get("__call__"))
    codes = [getattr(each, "__code__", None) for each in callables]
    return frame.f_code in [code for code in codes if code is not None]


def _keep_sigint_exit(value: BaseException) -> None:
    """An uncaught KeyboardInterrupt ends Python by SIGINT, through a flag that its top level
    sets and that every exec() of a string clears (a namedtuple made by an import while the
    record is written does). Set again the only way Python offers: a string that raises it.
    Only when Python itself called the hook for it: a console that calls the hook itself goes
    on running, and must not die of SIGINT at its exit."""
    if _called_by_python_itself(value):
        try:
            exec("raise KeyboardInterrupt")  # noqa: S102 - a constant: see above
        except BaseException:  # noqa: BLE001, S110 - the KeyboardInterrupt raised on purpose
            pass


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
            if isinstance(value, KeyboardInterrupt):
                _keep_sigint_exit(value)

    def thread_excepthook(self, args: Any) -> None:
        try:
            value = args.exc_value
            thread = args.thread if args.thread is not None else job_thread()
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
    """What probing puts on SIGTERM, SIGINT and SIGHUP (see the module doc)."""

    def __init__(self, on_signal: Callable[[int, Optional[FrameType]], None]) -> None:
        # Starts the record and returns within a bound, whatever happens to the record.
        self.on_signal = on_signal
        self.active = False
        # The job's Python handlers that ours stands in front of, by signal.
        self.job_handlers: Dict[int, Any] = {}
        # Signals faulthandler dumps into dump_fd on their way to the default action.
        self.dumping: Set[int] = set()
        self.dump_fd: Optional[int] = None
        self.original_signal: Any = signal.signal
        self.original_getsignal: Any = signal.getsignal
        self.notes: List[str] = []

    def install(self, dump_fd: Optional[int]) -> None:
        """`dump_fd`: the .fatal file's descriptor (None: no stacks for default-action deaths)."""
        self.active = True
        self.dump_fd = dump_fd
        in_main = on_main_thread()
        for signum in HOOKED_SIGNALS:
            name = signal.Signals(signum).name
            current = self.original_getsignal(signum)
            if current is None:
                self.notes.append(f"{name}: handled in C by the job; no record for it")
            elif current == signal.SIG_DFL:
                if signum in DUMPED_SIGNALS:
                    self._dump_on(signum)
            elif current == signal.SIG_IGN or current is signal.default_int_handler:
                continue  # ignored (nohup), or a KeyboardInterrupt the excepthook records
            elif in_main:
                self._front(signum, current)
            else:
                self.notes.append(
                    f"{name}: the job's own handler was set before the agent was attached (only "
                    "an agent started with the job can stand in front of it); no record for it"
                )
        if in_main:
            signal.signal = self.job_signal
            signal.getsignal = self.job_getsignal

    def _dump_on(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.dump_fd is None:
            self.notes.append(f"{name}: no .fatal file, so no stacks if it ends the job")
            return
        try:
            # Only ever called where the action is the default. A registration left inert by a
            # handler the job set over it (job_signal) would make register() update its file and
            # install nothing: unregister first, which puts back the default it found.
            faulthandler.unregister(signum)
            # Only the stack of the thread the signal interrupted (the main thread, as a rule:
            # Linux offers a signal sent to the process to it first). all_threads=True walks the
            # other threads' states without a lock, from a signal that comes at any moment: a
            # thread ending then frees its state under the walk, and the job died of SIGSEGV
            # instead (CPython gh-116008). A dying job must die of its own signal.
            faulthandler.register(signum, file=self.dump_fd, all_threads=False, chain=True)
        except (OSError, RuntimeError, ValueError) as error:
            self.notes.append(f"{name}: no stacks if it ends the job ({error})")
            return
        self.dumping.add(signum)

    def _undump(self, signum: int) -> None:
        """faulthandler off for `signum`. It then puts back the action it found (the default):
        callers set what must be there after this."""
        if signum in self.dumping:
            self.dumping.discard(signum)
            try:
                faulthandler.unregister(signum)
            except (OSError, RuntimeError, ValueError):
                pass

    def _front(self, signum: int, job_handler: Any) -> None:
        try:
            self.original_signal(signum, self.handler)
        except (OSError, ValueError, RuntimeError) as error:
            self.notes.append(f"{signal.Signals(signum).name}: not hooked ({error})")
            return
        self.job_handlers[signum] = job_handler

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
        # Only if ours outlived its entry (a detach from another thread): the default action.
        self.original_signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return None

    def job_signal(self, signalnum: Any, handler: Any) -> Any:
        """signal.signal as the job calls it: a handler of the job's goes behind ours, the
        default action of SIGTERM/SIGHUP gets its dump back, anything else is set as asked."""
        if signalnum not in HOOKED_SIGNALS or not self.active:
            return self.original_signal(signalnum, handler)
        previous = self.job_getsignal(signalnum)
        # Set first as the job asked: the same checks (main thread, a callable) and errors. That
        # replaces faulthandler's handler; its registration stays, inert (unregister would put
        # the default action back for a moment, and a signal then would kill a job that had just
        # asked to handle or ignore it). _dump_on clears it before registering again.
        self.original_signal(signalnum, handler)
        self.dumping.discard(signalnum)
        self.job_handlers.pop(signalnum, None)
        if handler == signal.SIG_DFL and signalnum in DUMPED_SIGNALS:
            self._dump_on(signalnum)
        elif callable(handler) and handler is not signal.default_int_handler:
            self._front(signalnum, handler)
        return previous

    def job_getsignal(self, signalnum: Any) -> Any:
        """The job's handler while ours stands in front of it; else what is really there (code
        that set its own through `_signal` or an earlier `signal.signal` got past the wrapper)."""
        actual = self.original_getsignal(signalnum)
        if self.active and signalnum in self.job_handlers:
            if actual == self.handler:
                return self.job_handlers[signalnum]
            del self.job_handlers[signalnum]
        return actual

    def stop_dumping(self) -> None:
        """faulthandler off for the signals it dumps, where the job has not set a handler since
        (unregister would put the default action over it): before the .fatal file closes."""
        for signum in list(self.dumping):
            try:
                untouched = self.original_getsignal(signum) == signal.SIG_DFL
            except (OSError, ValueError, RuntimeError):
                untouched = False
            if untouched:
                self._undump(signum)
        self.dumping.clear()

    def uninstall(self, in_child: bool = False) -> None:
        """The job's handlers back where ours still is. Python handlers can be set only in the
        main thread (after fork, the forking thread is the child's): from another thread ours
        stays and only passes on to the job's."""
        self.active = False
        if signal.signal == self.job_signal:
            signal.signal = self.original_signal
        if signal.getsignal == self.job_getsignal:
            signal.getsignal = self.original_getsignal
        self.stop_dumping()
        if not in_child and not on_main_thread():
            return
        for signum, job_handler in list(self.job_handlers.items()):
            try:
                if self.original_getsignal(signum) == self.handler:
                    self.original_signal(signum, job_handler)
            except (OSError, ValueError, RuntimeError, TypeError):
                pass
        self.job_handlers = {}
