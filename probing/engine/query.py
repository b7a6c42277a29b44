"""SQL over one target's tables: the tables a query names are fetched from the agent (or, for
python.backtrace and process.stats, read from outside when the agent cannot answer) and loaded
into a DuckDB session in this process (DESIGN.md says why SQL runs here)."""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional

from ..errors import AgentTimeout, AgentUnreachable, AttachFailed, AttachTimeout
from ..schema.tables import AGENT_TABLES, BACKTRACE
from ..sql.session import SqlSession
from .backtrace import ask, from_outside
from .process_tables import LOCAL_TABLES, local_rows, local_tables_described
from .target import Fallback, Target

# Beyond --step-wait, what a torch table may take to install its step hook on first use.
STEP_HOOK_INSTALL_S = 1.0


class LoadedTables(NamedTuple):
    """A session holding every table the query names, and notes on how they were read."""

    session: SqlSession
    pid: Optional[int]
    notes: List[str]


def static_session() -> SqlSession:
    """A session with the tables this CLI knows (the agent's own list may differ by version)."""
    return SqlSession([table.describe() for table in AGENT_TABLES.values()] + local_tables_described())


def load_tables(
    target: Target, sql: str, timeout: float, scan_budget: float = 1.0, step_wait: float = 1.0
) -> LoadedTables:
    """Fetch the tables `sql` names into a new session; run the query with `.session.run(sql)`."""
    session = static_session()
    wanted = session.referenced_tables(sql)
    local = [name for name in wanted if name in LOCAL_TABLES]
    pid = target.pid
    notes: List[str] = []
    if target.pid is None or not wanted or len(local) < len(wanted):
        try:
            with target.connect(timeout, attach_budget=timeout, give_up_early=True) as client:
                described, _ = ask(client, "tables", {}, timeout, target)
                session = SqlSession(described["tables"] + local_tables_described())
                pid = pid or client.info.get("pid")  # ours: the agent's may be a container's
                for name in session.referenced_tables(sql):
                    if name in LOCAL_TABLES:
                        continue
                    target.log(f"fetching {name}")
                    params = {"scan_budget_s": scan_budget, "step_wait_s": step_wait}
                    wait = timeout + scan_budget + step_wait + STEP_HOOK_INSTALL_S
                    table = client.fetch_table(name, params, wait)
                    notes.extend(table.notes)
                    session.load(table)
        except (AgentTimeout, AgentUnreachable, AttachFailed, AttachTimeout) as error:
            session = _outside_session(target, sql, error.message, isinstance(error, AgentUnreachable), notes)
        except Fallback as fallback:
            session = _outside_session(target, sql, fallback.why, fallback.unreachable, notes)
    for name in local:
        target.log(f"reading {name} with psutil")
        session.load_rows(LOCAL_TABLES[name], local_rows(name, pid or 0))
    return LoadedTables(session, pid, notes)


def _outside_session(target: Target, sql: str, why: str, unreachable: bool, notes: List[str]) -> SqlSession:
    """A session over python.backtrace read from outside; other tables cannot be, and the
    error says why the agent did not give them: it went away (exit 1) or stayed silent (7)."""
    session = static_session()
    wanted = session.referenced_tables(sql)
    if (
        target.pid is None
        or BACKTRACE.name not in wanted
        or any(name != BACKTRACE.name and name not in LOCAL_TABLES for name in wanted)
    ):
        failure = AgentUnreachable if unreachable else AgentTimeout
        raise failure(
            why, hint="only queries over python.backtrace (and process.stats) can be answered from outside"
        )
    stacks = from_outside(target, False, None, why)
    names = BACKTRACE.column_names()
    rows: List[Any] = [tuple(row[name] for name in names) for row in stacks.rows]
    session.load_rows(BACKTRACE, rows)
    notes.append(f"{why}; python.backtrace read from outside the process (py-spy)")
    return session


def describe_tables(target: Target, timeout: float) -> List[Dict[str, Any]]:
    """Every table of the target (the agent's, then this side's) with its documented columns."""
    with target.connect(timeout) as client:
        return client.describe_tables() + local_tables_described()
