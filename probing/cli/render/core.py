"""`probing core CORE`: how the process in the core ended, then its stacks read like a
traceback (the renderer of `probing PID backtrace`), or its python.backtrace rows."""

from __future__ import annotations

import signal
import sys
from typing import IO, TYPE_CHECKING, Optional

from ...schema.rows import backtrace_values_of
from ...schema.tables import BACKTRACE
from . import inert, note
from .backtrace import write_backtrace_text
from .rows import write_rows

if TYPE_CHECKING:
    from ...engine.core import CoreStacks
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


def write_core(answer: CoreStacks, format: str, out: Optional[IO[str]] = None) -> None:
    out = out or sys.stdout
    reading = answer.reading
    if reading.cut_short:
        note(f"{reading.path}: more threads or frames than probing shows; the outermost frames are left out")
    sys.stderr.flush()
    if format != "text":
        names = BACKTRACE.column_names()
        types = [column.type for column in BACKTRACE.columns]
        write_rows(names, types, [backtrace_values_of(row) for row in reading.rows], format, out)
        return
    out.write(f"Core file {inert(reading.path)}: {how_it_ended(reading)}\n")
    write_backtrace_text(answer.stacks, out)
