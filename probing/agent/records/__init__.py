"""Records: what the agent knew, written to a file when the job ends (issue 15).

When an uncaught exception ends a thread (a KeyboardInterrupt from SIGINT included), when a
SIGTERM, SIGINT or SIGHUP arrives for a handler of the job's own, when `nan on --stop` stops
the job, and when asked (`record`: `probing PID record`, the `run --hang-timeout` watchdog),
the agent writes every table it holds, with the stacks at that moment and why, into
PROBING_RECORD_DIR (protocol/records.py is the format, writer.py what goes in). Fatal signals,
and SIGTERM or SIGHUP with their default action, leave the `.fatal` file that faulthandler
writes into (fatal.py, hooks.py).

Hooks only: no thread and no timer while the job runs (one open file, faulthandler's C
handlers, and the wrapped `signal.signal` are what a job that never ends carries). The job's
exception, exit status and signal behaviour stay its own: a record that cannot be written
becomes a note (`failures`), and the job's own hooks and handlers run as they would without
probing, a handler of its own at most SIGNAL_RECORD_WAIT_S later (hooks.py). PROBING_RECORD=0
installs nothing.
"""

from __future__ import annotations

import atexit
import signal
import sys
import threading
from types import FrameType
from typing import Any, Dict, List, Optional

from ...originals import Event, allocate_lock, get_ident, monotonic, wall_time
from ..lifecycle import JOB_HOOKS, on_fork_in_child, on_stop
from ..requests import ErrorKind, RequestError
from ..threads import AgentThread, job_thread
from . import settings
from .fatal import FatalFile, open_fatal_file
from .hooks import ExceptionHooks, SignalHooks, mark, marked
from .trigger import Trigger

# A SIGTERM this soon after a watchdog's record is the watchdog ending the job: one record.
AFTER_WATCHDOG_S = 60.0
# A KeyboardInterrupt this soon after a SIGINT record is that SIGINT: one record.
AFTER_SIGNAL_S = 60.0
# How many failures are kept to say why records are missing.
MAX_FAILURES = 20
# A job whose worker threads keep dying (and being restarted) gets one thread record this often.
THREAD_RECORD_EVERY_S = 10.0
# A signal the job's own handler survives (SIGHUP to reload, SIGINT in a notebook) gets one
# record this often, per signal.
SIGNAL_RECORD_EVERY_S = 60.0
# How long the job's signal handler waits for the record before it runs anyway.
SIGNAL_RECORD_WAIT_S = 1.0
# How long the exit waits for a signal's record still being written (the job's handler ended it).
SIGNAL_RECORD_AT_EXIT_S = 2.0


class Records:
    """The hooks of one process and what they need to write."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.notes: List[str] = []  # about the hooks themselves, copied into every record
        self.failures: List[str] = []
        self.written: List[str] = []
        self.lock = allocate_lock()
        self.writing_thread: Optional[int] = None
        self.last_kind: Optional[str] = None
        self.last_at = 0.0
        self.last_thread_record_at: Optional[float] = None
        self.thread_records_skipped = 0
        self.last_signal_record_at: Dict[int, float] = {}
        self.signal_records_skipped: Dict[int, int] = {}
        self.signal_writer: Optional[AgentThread] = None
        self.exceptions = ExceptionHooks(self.on_exception)
        self.signals = SignalHooks(self.on_signal)
        self.fatal: Optional[FatalFile] = None
        self.pid = 0

    # --- writing -----------------------------------------------------------------------------

    def write(self, trigger: Trigger) -> Dict[str, Any]:
        """One record; RecordFailed when none was written. Records are written one at a time,
        and a hook that fires inside a write (a signal while the excepthook writes) gets none."""
        me = get_ident()
        # The writer (tables, the protocol's encoders) is loaded when a record is written: a job
        # that never dies never loads it.
        from .writer import RecordFailed, write

        if self.writing_thread == me:
            raise RecordFailed("a record is being written by this very thread")
        if not self.lock.acquire(timeout=30.0):
            raise RecordFailed("another record took more than 30 s")
        self.writing_thread = me
        try:
            result = write(self.server, trigger, self.notes + self.signals.notes)
        finally:
            self.writing_thread = None
            self.lock.release()
        self.written.append(result["path"])
        self.last_kind, self.last_at = trigger.kind, monotonic()
        return result

    def write_quietly(self, trigger: Trigger) -> None:
        """From a hook inside the job: never raises, whatever happened."""
        try:
            self.write(trigger)
        except Exception as error:  # noqa: BLE001 - a hook of the job's must never fail it
            # RecordFailed says why in its message; anything else is a bug of ours, named.
            message = str(error) if type(error).__name__ == "RecordFailed" else ""
            self._failed(message or f"{type(error).__name__}: {error}")

    def _failed(self, why: str) -> None:
        if len(self.failures) < MAX_FAILURES:
            self.failures.append(why)

    def _recent(self, kind: str, within: float) -> bool:
        return self.last_kind == kind and monotonic() - self.last_at < within

    # --- what the hooks call -------------------------------------------------------------------

    def on_exception(self, error: BaseException, thread: threading.Thread) -> None:
        if isinstance(error, KeyboardInterrupt) and self._recent("signal", AFTER_SIGNAL_S):
            return
        mark(error)
        main = thread is threading.main_thread()
        if not main:
            now = monotonic()
            last = self.last_thread_record_at
            if last is not None and now - last < THREAD_RECORD_EVERY_S:
                self.thread_records_skipped += 1
                return
            self.last_thread_record_at = now
            if self.thread_records_skipped:
                self.notes.append(
                    f"{self.thread_records_skipped} earlier thread exceptions were not recorded "
                    f"(one thread record every {THREAD_RECORD_EVERY_S:g} s)"
                )
                self.thread_records_skipped = 0
        self.write_quietly(Trigger.from_exception(error, thread, training_thread=main))

    def on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        """In the main thread, in front of the job's own handler: the record is written by a
        thread of its own while this waits at most SIGNAL_RECORD_WAIT_S. The interrupted main
        thread may hold a ring's lock the record needs, or be the one a device sync would block:
        the job's handler must not wait on either. So this record reads no tensor data and runs
        none of the job's __repr__ (no locals)."""
        if self._recent("watchdog", AFTER_WATCHDOG_S):
            return
        now = monotonic()
        last = self.last_signal_record_at.get(signum)
        if last is not None and now - last < SIGNAL_RECORD_EVERY_S:
            self.signal_records_skipped[signum] = self.signal_records_skipped.get(signum, 0) + 1
            return
        self.last_signal_record_at[signum] = now
        # Set now, not when written: a KeyboardInterrupt the job's handler raises is this signal.
        self.last_kind, self.last_at = "signal", now
        name = signal.Signals(signum).name
        skipped = self.signal_records_skipped.pop(signum, 0)
        if skipped:
            self.notes.append(
                f"{skipped} earlier {name} were not recorded (one record per signal every "
                f"{SIGNAL_RECORD_EVERY_S:g} s)"
            )
        trigger = Trigger(
            "signal", f"{name} received", signum=signum, frame=frame, thread=threading.main_thread(),
            locals=False, helper_thread=True,
        )  # fmt: skip
        written = Event()

        def write_record() -> None:
            try:
                self.write_quietly(trigger)
            finally:
                written.set()

        # An agent thread (threads.py): the job's threading never counts it, even mid-write.
        writer = AgentThread(target=write_record, name="probing-record")
        try:
            writer.start()
        except RuntimeError as error:  # the interpreter is shutting down
            self._failed(f"{name}: no record ({error})")
            return
        self.signal_writer = writer
        if not written.wait(SIGNAL_RECORD_WAIT_S):
            # Read when the header is made, after the tables: the part that waits.
            trigger.notes.append(
                f"the job's own {name} handler was called after {SIGNAL_RECORD_WAIT_S:g} s, "
                "while this record was being written: what follows may be from after it"
            )

    def on_nonfinite(self, error: BaseException) -> None:
        """`nan on --stop` is about to raise `error` in the training thread."""
        mark(error)
        self.write_quietly(Trigger("nan", str(error), error=error, thread=job_thread(), training_thread=True))

    def at_exit(self) -> None:
        """An uncaught exception the job's own sys.excepthook took (it replaced ours): Python
        left it in sys.last_value before calling that hook. Then the .fatal file goes."""
        if self.pid != _own_pid():
            return
        writer = self.signal_writer
        if writer is not None and writer.is_alive():
            writer.join(SIGNAL_RECORD_AT_EXIT_S)
        value = getattr(sys, "last_value", None)
        # With ours still in place every uncaught exception went through it: a sys.last_value
        # it did not mark was left by an interactive console (code, IPython), not by a death.
        replaced = sys.excepthook != self.exceptions.excepthook
        if self.exceptions.active and replaced and isinstance(value, BaseException) and not marked(value):
            interrupted = isinstance(value, KeyboardInterrupt) and self._recent("signal", AFTER_SIGNAL_S)
            if not interrupted:
                mark(value)
                trigger = Trigger.from_exception(value, threading.main_thread(), training_thread=True)
                self.notes.append("recorded at exit: the job's own sys.excepthook had replaced probing's")
                self.write_quietly(trigger)
        self.close_fatal(remove=True)

    def close_fatal(self, remove: bool) -> None:
        self.signals.stop_dumping()  # faulthandler must never write into a closed descriptor
        fatal, self.fatal = self.fatal, None
        if fatal is not None:
            fatal.close(remove)

    # --- installing ------------------------------------------------------------------------------

    def install(self) -> None:
        self.pid = _own_pid()
        self.exceptions.install()
        try:
            directory = settings.prepare_dir(settings.record_dir())
        except settings.RecordDirRefused as error:
            self.notes.append(f"fatal signals: no .fatal file (record directory refused: {error})")
        else:
            from .header import header

            fatal_header = header(Trigger("fatal_signal", "a fatal signal"), [], wall_time())
            self.fatal = open_fatal_file(directory, fatal_header, self.notes)
        self.signals.install(self.fatal.fd if self.fatal is not None else None)
        atexit.register(self.at_exit)

    def uninstall(self, in_child: bool = False) -> None:
        self.exceptions.uninstall()
        self.signals.uninstall(in_child)
        atexit.unregister(self.at_exit)
        self.close_fatal(remove=not in_child)


def _own_pid() -> int:
    import os

    return os.getpid()


_records: Optional[Records] = None


def install(server: Any) -> Optional[Records]:
    """Install the hooks once per process (an agent started again only gets the new server);
    None when PROBING_RECORD=0."""
    global _records
    if _records is not None:
        _records.server = server
        return _records
    if not settings.enabled():
        return None
    records = Records(server)
    _records = records  # set first: a failure below still leaves it to uninstall at detach
    on_stop(uninstall, JOB_HOOKS)
    on_fork_in_child(_drop_in_child)
    records.install()
    return records


def uninstall() -> None:
    """Detach: every hook off, the job's own back."""
    global _records
    records, _records = _records, None
    if records is not None:
        records.uninstall()


def _drop_in_child() -> None:
    # A forked child (a DataLoader worker) is not the job: the parent's record covers it.
    global _records
    records, _records = _records, None
    if records is not None:
        records.uninstall(in_child=True)


def current() -> Optional[Records]:
    return _records


def record_now(server: Any, kind: str, message: str) -> Dict[str, Any]:
    """The `record` method: a record of the live job, now. A record that could not be written
    is a RequestError of kind RECORD_NOT_WRITTEN whose message says why (a full disk, a refused
    directory): the job's environment, not a bug of the agent."""
    from .writer import RecordFailed, write

    records = _records
    trigger = Trigger(kind, message or ("asked by the watchdog" if kind == "watchdog" else "asked for"))
    try:
        if records is None:
            return write(server, trigger)
        records.server = server
        result = records.write(trigger)
    except RecordFailed as error:
        raise RequestError(ErrorKind.RECORD_NOT_WRITTEN, f"no record: {error}") from None
    # Why earlier records of this process are missing (a refused directory, a full disk).
    result["failures"] = list(records.failures)
    return result


def before_nonfinite_raise(error: BaseException) -> None:
    """Called by `nan on --stop` (pytorch/nonfinite.py) in the training thread before it raises."""
    records = _records
    if records is not None:
        records.on_nonfinite(error)
