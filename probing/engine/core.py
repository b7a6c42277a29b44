"""A core file as a target: its python.backtrace rows, the human view's inputs, and SQL over them.

Only the stacks outlive the process in a core (pystack reads nothing else of it); a query that
names another table is told so (NotLive), not answered with an empty table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Optional

from ..errors import BadSQL, NotLive, ProbingError
from ..outside.core import CoreReading, read_core
from ..schema.rows import backtrace_values_of
from ..schema.tables import AGENT_TABLES, BACKTRACE
from ..sql.session import SqlSession, referenced_tables
from .process_tables import LOCAL_TABLES

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
