"""A core file (a crashed job's, or a gcore of a live one): its Python stacks, read with pystack
in a process of its own, and SQL over them. Only the stacks outlive the process in a core.
"""

from __future__ import annotations

import os

from ...schema.tables import BACKTRACE
from ..records.path import open_regular
from .base import Kind, One, Rows

# No typing at run time, and the core reader loaded when a core is read: `probing PID backtrace`
# loads this module to tell a core file from a PID (CONTRIBUTING.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

    from ...outside.core import CoreReading

# pystack's read of a large core takes seconds: a command's --timeout for an agent's answer
# (a few seconds) is no bound for it; the longer of the two is.
READ_TIMEOUT_S = 60.0
# ELF's e_type of a core file, at offset 16 of the header.
_ET_CORE = 4


def is_core_path(text: str) -> bool:
    """Whether `text` names a regular file that is an ELF core (its first 18 bytes say so)."""
    if text.isdigit() or "://" in text:
        return False
    try:
        descriptor = open_regular(text)
    except (OSError, ValueError):
        return False
    try:
        header = os.read(descriptor, 18)
    except OSError:
        return False
    finally:
        os.close(descriptor)
    if len(header) < 18 or header[:4] != b"\x7fELF" or header[5] not in (1, 2):
        return False
    return int.from_bytes(header[16:18], "little" if header[5] == 1 else "big") == _ET_CORE


class Core(Kind):
    described = "a core file (only the stacks outlive the process in a core)"
    instead = (
        "a core answers backtrace, query over python.backtrace and tables; the rest needs a live "
        "process's PID, or a record the job's agent left (`probing records`)"
    )

    def __init__(
        self, text: str, command: str, executable: Optional[str] = None,
        log: Optional[Callable[[str], None]] = None,
    ) -> None:  # fmt: skip
        super().__init__(text, command)
        self.executable = executable
        self.log = log

    def read(self, locals: bool, thread: Optional[str], timeout: float) -> CoreReading:
        from ..core import read_core_stacks

        timeout = max(timeout, READ_TIMEOUT_S)
        return read_core_stacks(self.text, self.executable, locals, thread, timeout, self.log)

    def stacks(
        self, locals: bool, thread: Optional[str], timeout: float, native: bool, children: bool,
        attach_children: bool,
    ) -> One:  # fmt: skip
        from ..core import CoreStacks

        self.refuse_live_stacks(native, children or attach_children)
        return One(CoreStacks(self.read(locals, thread, timeout)))

    def query(self, sql: str, timeout: float, scan_budget: float, step_wait: float) -> One:
        from ..core import query_core

        result = query_core(self.read(False, None, timeout), sql)
        return One(Rows(result.columns, result.types, result.rows))

    def describe(self, timeout: float) -> One:
        return One([BACKTRACE.describe()])
