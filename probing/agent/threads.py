"""Threads the agent starts: invisible to the job's `threading`, silent whatever they raise.

A job can count threading's threads, and many do: `while threading.active_count() > 1:
time.sleep(0.1)` waits for its workers before it exits, and with an agent thread in
`threading._active` it waited forever; `threading.enumerate()` in an eval listed the agent's own.
So agent threads are started with `_thread.start_new_thread` (the function threading itself
wraps, kept from before the job could patch it: originals.py) and never registered with
`threading`: they are in neither `_active`, `_limbo` nor `_shutdown`'s join list, on every CPython.
Like daemon threads, nothing waits for them at exit. Code that runs in them must never call
`threading.current_thread()`, which would register a `_DummyThread` for them (`job_thread()`
below reads without registering; an eval's code may call it, and evaluate/ forgets what it made).

An exception that leaves a `_thread` thread goes to `sys.unraisablehook`, which is the job's:
every agent thread runs inside a handler that keeps whatever it raises (BaseException: an
eval's interrupt can land anywhere) for `errors` and lets nothing reach the job.

Nor do they run the job's tracer or profiler: `threading.settrace`/`setprofile` (`python -m
trace`, coverage's PyTracer, a pure-Python debugger) reach only threads threading starts, and
each agent thread clears `sys.settrace`/`setprofile` too, for a tracer installed some other way.
A tracer is job code: in an agent thread it slows every request down, can stall one, and it hands
the GIL over between any two lines, where the 3.11 frame reader (evaluate/framelocals.py) must
keep it. `sys.monitoring` (3.12+) belongs to the interpreter, not to a thread, and is left alone.

Each thread gives itself its name as the OS knows it (/proc/self/task/TID/comm, as
pthread_setname_np does): with no `threading` name, that is how py-spy's view of the process,
`top -H` and the CLI's outside path tell the agent's threads from the job's.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, List, Optional, Tuple

from ..originals import allocate_lock, get_ident, get_native_id, start_new_thread
from .stacks import main_thread_ident

# The prefix of every agent thread's OS name; the CLI's outside path leaves such threads out.
NAME_PREFIX = "probing-"
# What the OS keeps of a thread name (TASK_COMM_LEN, the NUL included).
_COMM_BYTES = 15
# The last errors agent threads ended with, for `hello` and the tests (bounded).
errors: List[str] = []
_MAX_ERRORS = 20


def set_os_name(name: str) -> None:
    """Name the calling thread as the OS sees it (comm). Never raises: a name is a courtesy."""
    try:
        fd = os.open(f"/proc/self/task/{get_native_id()}/comm", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, name.encode("ascii", "replace")[:_COMM_BYTES])
    except OSError:
        pass
    finally:
        os.close(fd)


class AgentThread:
    """One thread of the agent's: the subset of threading.Thread the agent uses (start, join,
    is_alive, ident, native_id, name), on a thread that `threading` never sees."""

    def __init__(
        self, target: Callable[..., Any], name: str, args: Tuple[Any, ...] = (), daemon: bool = True
    ) -> None:
        # `daemon` is accepted for threading.Thread's signature; every agent thread is one.
        self.name = name
        self.ident: Optional[int] = None
        self.native_id: Optional[int] = None
        self._target = target
        self._args = args
        self._started = allocate_lock()
        self._started.acquire()
        self._ended = allocate_lock()
        self._ended.acquire()
        self._running = False

    def start(self) -> None:
        """Start the thread and return once it runs (as threading.Thread.start does: its ident
        and native id are known). RuntimeError when the system has no thread to give."""
        if self._running or not self._ended.locked():
            raise RuntimeError(f"agent thread {self.name} started twice")
        self._running = True
        try:
            self.ident = start_new_thread(self._bootstrap, ())
        except BaseException:
            self._running = False
            raise
        self._started.acquire()

    def _bootstrap(self) -> None:
        said_started = False
        try:
            block_job_signals()
            sys.settrace(None)
            sys.setprofile(None)
            self.native_id = get_native_id()
            set_os_name(self.name)
            said_started = True
            self._started.release()
            self._target(*self._args)
        except BaseException as error:  # noqa: BLE001 - nothing of ours may reach the job's hooks
            _keep_error(self.name, error)
        finally:
            self._running = False
            try:
                if not said_started:
                    self._started.release()
                self._ended.release()
            except BaseException:  # noqa: BLE001, S110 - an interrupt that landed in between
                pass

    def is_alive(self) -> bool:
        return self._running

    def join(self, timeout: Optional[float] = None) -> None:
        if self.ident is None or self.ident == get_ident():
            return
        if self._ended.acquire(True, -1 if timeout is None else max(timeout, 0.0)):
            self._ended.release()


# Signals sent to the process that the kernel must give to one of the job's threads, not the
# agent's: a SIGTERM's C handler (records/hooks.py) dumps the stack of the thread it interrupts.
JOB_SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")


def block_job_signals() -> None:
    """Block JOB_SIGNALS in the calling agent thread (the job's handlers run in its main thread
    whichever thread the kernel picks, so nothing of the job's changes)."""
    try:
        import signal

        signal.pthread_sigmask(signal.SIG_BLOCK, {getattr(signal, name) for name in JOB_SIGNALS})
    except Exception:  # noqa: BLE001, S110 - a platform without it: the kernel picks as it will
        pass


def _keep_error(name: str, error: BaseException) -> None:
    try:
        errors.append(f"{name}: {type(error).__name__}: {error}")
        del errors[:-_MAX_ERRORS]
    except BaseException:  # noqa: BLE001, S110 - a str() of the job's object that raises
        pass


def job_thread(ident: Optional[int] = None) -> Any:
    """threading's Thread object for a thread, without ever making one: None for a thread
    threading does not know (an agent thread, a thread the job started with `_thread`).
    `threading.current_thread()` would register a `_DummyThread` for it in the job's
    `threading._active`, which the job can count."""
    threading = sys.modules.get("threading")
    active = getattr(threading, "_active", None)
    if not isinstance(active, dict):
        return None
    return active.get(get_ident() if ident is None else ident)


def on_main_thread() -> bool:
    """Whether the calling thread is the interpreter's main thread, asked without
    threading.current_thread() (which, in an agent thread, would register a _DummyThread)."""
    return get_ident() == main_thread_ident()


def forget_dummy(ident: int) -> None:
    """Remove the `_DummyThread` that code run in an agent thread (an eval's, the attach
    helper's) may have made for it by calling threading.current_thread()."""
    threading = sys.modules.get("threading")
    active = getattr(threading, "_active", None)
    dummy = getattr(threading, "_DummyThread", None)
    lock = getattr(threading, "_active_limbo_lock", None)
    if not isinstance(active, dict) or not isinstance(dummy, type) or lock is None:
        return
    with lock:
        if isinstance(active.get(ident), dummy):
            del active[ident]
