"""`probing core CORE`: how the process in the core ended, then its stacks read like a
traceback (the renderer of `probing PID backtrace`), or its python.backtrace rows."""

from __future__ import annotations

import os
import signal
import sys
from typing import IO, TYPE_CHECKING, Any, Dict, List, Optional

from ...engine.sources import SourceLines, reader_for_owner
from ...schema.tables import BACKTRACE
from . import inert, note
from .backtrace import write_backtrace_text
from .rows import write_rows

if TYPE_CHECKING:
    from ...outside.core import CoreReading

SIGSTOP = 19
# Signals whose fault address says where the process failed.
_FAULTS = {4: "SIGILL", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV"}


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def how_it_ended(reading: CoreReading) -> str:
    """What the core says of the process's end, in words."""
    number = reading.signal
    if not number:
        return "no signal recorded"
    if number == SIGSTOP:
        # gcore (and gdb's generate-core-file) stop the process to copy it; the kernel never
        # writes a core on SIGSTOP.
        return "a live process, stopped to be copied (gcore or a debugger wrote it)"
    where = ""
    if number in _FAULTS and reading.fault_address is not None:
        where = f" at address {reading.fault_address:#x}"
    return f"ended by {signal_name(number)}{where}"


def write_core(reading: CoreReading, format: str, out: Optional[IO[str]] = None) -> None:
    out = out or sys.stdout
    if reading.cut_short:
        note(f"{reading.path}: more threads or frames than probing shows; the outermost frames are left out")
    sys.stderr.flush()
    if format != "text":
        names = BACKTRACE.column_names()
        types = [column.type for column in BACKTRACE.columns]
        write_rows(names, types, [tuple(row[name] for name in names) for row in reading.rows], format, out)
        return
    out.write(f"Core file {inert(reading.path)}: {how_it_ended(reading)}\n")
    info: Dict[str, Any] = {
        # Text, not an int: the renderer would look for the job's files under /proc/PID/root,
        # and that PID may be another process's by now.
        "pid": str(reading.pid) if reading.pid is not None else "?",
        "python_version": reading.python_version or "?",
        "argv": [reading.arguments],
    }
    write_backtrace_text(
        _grouped_by_native_id(reading.rows), info, out, None, _gil_view(reading), _sources(reading.path)
    )


def _sources(path: str) -> SourceLines:
    """The job's source lines, read as the core's owner (the kernel writes a core as the user
    whose process dumped it): root reading another user's core shows only what that user could
    read, as for a record."""
    try:
        status = os.stat(path)
    except OSError:
        return SourceLines(None)
    return SourceLines(None, reader_for_owner(status.st_uid, status.st_gid))


def _grouped_by_native_id(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The renderer groups frames by (pid, thread_id); a core gives no Python ident (thread_id
    is NULL), so each thread's native id stands in for it here."""
    return [dict(row, thread_id=row["native_id"]) for row in rows]


def _gil_view(reading: CoreReading) -> Dict[Any, Dict[str, Any]]:
    """The thread that held the GIL, in the shape the renderer takes py-spy's view of threads."""
    return {reading.gil: {"owns_gil": True}} if reading.gil is not None else {}
