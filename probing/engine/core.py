"""A core file as a target: its python.backtrace rows, the human view's inputs, and SQL over them.

Only the stacks outlive the process in a core (pystack reads nothing else of it); a query that
names another table is told so (NotLive), not answered with an empty table.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from ..errors import BadSQL, NotLive, ProbingError
from ..outside.core import CoreReading, read_core
from ..schema.rows import backtrace_values_of
from ..schema.tables import AGENT_TABLES, BACKTRACE
from ..sql.session import SqlSession, referenced_tables
from .backtrace import Stacks
from .process_tables import LOCAL_TABLES
from .sources import SourceLines, reader_for_owner

if TYPE_CHECKING:
    from ..schema.rows import BacktraceRow


def read_core_stacks(
    core: str,
    executable: Optional[str],
    locals: bool,
    thread: Optional[str],
    timeout: float,
    log: Optional[Callable[[str], None]] = None,
) -> CoreReading:
    """The core's stacks; with `thread`, that thread's only (its name or native id)."""
    reading = read_core(core, executable, locals, timeout, log)
    if thread is not None:
        reading.rows = only_thread(reading.rows, thread)
    return reading


class CoreStacks:
    """What `probing CORE backtrace` shows: the reading (how the process ended) and its stacks."""

    __slots__ = ("reading", "stacks")

    def __init__(self, reading: CoreReading) -> None:
        self.reading = reading
        info: Dict[str, Any] = {
            # Text, not an int: no source line is looked for under /proc/PID/root, and that PID
            # may be another process's by now.
            "pid": str(reading.pid) if reading.pid is not None else "?",
            "python_version": reading.python_version or "?",
            "argv": [reading.arguments],
            # The thread that held the GIL, in the shape of py-spy's view of threads.
            "outside": {reading.gil: {"owns_gil": True}} if reading.gil is not None else {},
        }
        # A core gives no Python ident (thread_id is NULL): each thread's native id stands in
        # for it, so that frames group by thread.
        rows: List[BacktraceRow] = [{**row, "thread_id": row["native_id"]} for row in reading.rows]
        self.stacks = Stacks(None, rows, info, [], _sources(reading.path))


def _sources(path: str) -> SourceLines:
    """The job's source lines, read as the core's owner (the kernel writes a core as the user
    whose process dumped it): root reading another user's core shows only what that user could
    read, as for a record."""
    try:
        status = os.stat(path)
    except OSError:
        return SourceLines(None)
    return SourceLines(None, reader_for_owner(status.st_uid, status.st_gid))


def only_thread(rows: List[BacktraceRow], thread: str) -> List[BacktraceRow]:
    chosen = [row for row in rows if thread in (row["thread_name"], str(row["native_id"]))]
    if not chosen:
        names = ", ".join(dict.fromkeys(f"{row['thread_name']} ({row['native_id']})" for row in rows))
        raise ProbingError(f"no thread named or numbered {thread!r} in the core; threads: {names or 'none'}")
    return chosen


def core_session(reading: CoreReading) -> SqlSession:
    """A session holding python.backtrace, the one table a core gives."""
    session = SqlSession([BACKTRACE.describe()])
    session.load_rows(BACKTRACE, [backtrace_values_of(row) for row in reading.rows])
    return session


def query_core(reading: CoreReading, sql: str) -> Any:
    """`sql` over the core's python.backtrace; a failing query that names a table only a live
    process (or a record) has raises NotLive, naming it."""
    session = core_session(reading)
    try:
        return session.run(sql)
    except BadSQL:
        others = [
            name for name in referenced_tables([*AGENT_TABLES, *LOCAL_TABLES], sql) if name != BACKTRACE.name
        ]
        if not others:
            raise
        raise NotLive(
            f"a core file holds python.backtrace only; {', '.join(others)} needs a live process",
            hint="a probing record (`probing records`) keeps every table of a job that ended",
        ) from None
