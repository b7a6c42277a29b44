"""SQL over one target's tables: the tables a query names are fetched from the agent (or, for
python.backtrace and process.stats, read from outside when the agent cannot answer) and loaded
into a DuckDB session in this process (DESIGN.md says why SQL runs here)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from .. import __version__
from ..analysis.rank_ranges import rank_numbers
from ..errors import AgentTimeout, AgentUnreachable, AttachFailed, AttachTimeout, UsageError
from ..outside.pyspy import outside_budget
from ..protocol.tables import DecodedTable
from ..schema.rows import backtrace_values_of
from ..schema.tables import AGENT_TABLES, BACKTRACE, JOB_TABLES, RANK_COLUMNS, Column, Table
from ..sql.derived import make_views, sources_named
from ..sql.session import SqlSession, notes_on_what_is_read, referenced_tables
from .backtrace import ask, from_outside
from .jobs.fanout import Missing, gather
from .jobs.job import Rank
from .process_tables import LOCAL_TABLES, local_rows, local_tables_described
from .target import REMOTE_HINT, Fallback, Target

# Beyond --step-wait, what a torch table may take to install its step hook on first use.
STEP_HOOK_INSTALL_S = 1.0


class LoadedTables(NamedTuple):
    """A session holding every table the query names, and notes on how they were read."""

    session: SqlSession
    pid: Optional[int]
    notes: List[str]


class Fetched(NamedTuple):
    """The tables a query names, as read from one target, not yet in any session: `described`
    is the agent's own list of tables (None when it could not be asked), `tables` what it sent,
    `rows` plain rows read on this side (from outside, process.stats)."""

    described: Optional[List[Dict[str, Any]]]
    tables: List[DecodedTable]
    rows: List[Tuple[Table, List[Any]]]
    pid: Optional[int]
    notes: List[str]


def static_session(added: Sequence[Column] = ()) -> SqlSession:
    """A session with the tables this CLI knows (the agent's own list may differ by version)."""
    return SqlSession([table.describe() for table in AGENT_TABLES.values()] + local_tables_described(), added)


def _known_names() -> List[str]:
    return list(AGENT_TABLES) + list(LOCAL_TABLES)


def _named(names: List[str], sql: str) -> List[str]:
    """Those of `names` the query reads: those it names, and the sources of the views it names
    (python.collective_timings reads python.collectives)."""
    wanted = sources_named(referenced_tables(names, sql), lambda views: referenced_tables(views, sql))
    return [name for name in wanted if name in names]


def fetch_tables(
    target: Target, sql: str, timeout: float, scan_budget: float = 1.0, step_wait: float = 1.0
) -> Fetched:
    """Read the tables `sql` names from the target (no DuckDB here: many ranks fetch at once)."""
    wanted = _named(_known_names(), sql)
    local = [name for name in wanted if name in LOCAL_TABLES]
    pid = target.pid
    notes: List[str] = []
    described: Optional[List[Dict[str, Any]]] = None
    tables: List[DecodedTable] = []
    rows: List[Tuple[Table, List[Any]]] = []
    if target.pid is None or not wanted or len(local) < len(wanted):
        try:
            with target.connect(timeout, attach_budget=timeout, give_up_early=True) as client:
                described, tables = _fetch_from(client, target, sql, timeout, scan_budget, step_wait, notes)
                pid = pid or client.info.get("pid")  # ours: the agent's may be a container's
        except (AgentTimeout, AgentUnreachable, AttachFailed, AttachTimeout) as error:
            fell_back: Optional[Tuple[str, bool]] = (error.message, isinstance(error, AgentUnreachable))
        except Fallback as fallback:
            fell_back = (fallback.why, fallback.unreachable)
        else:
            fell_back = None
        if fell_back is not None:
            described, tables = None, []
            rows.append(_from_outside(target, wanted, fell_back[0], fell_back[1], notes, timeout))
    for name in local:
        target.log(f"reading {name} with psutil")
        rows.append((LOCAL_TABLES[name], local_rows(name, pid or 0)))
    return Fetched(described, tables, rows, pid, notes)


def _fetch_from(
    client: Any, target: Target, sql: str, timeout: float, scan_budget: float, step_wait: float,
    notes: List[str],
) -> Tuple[List[Dict[str, Any]], List[DecodedTable]]:  # fmt: skip
    """The agent's table list and the tables `sql` names, in as few rounds as it allows. The
    hello comes with the first answer (pipelined); for a rank on another node that answer is the
    first table, asked for by this CLI's name for it, and an agent of this version then needs no
    `tables` request (described_in_hello); any other agent is asked for its list, and its tables
    are fetched by that list."""
    params = {"scan_budget_s": scan_budget, "step_wait_s": step_wait}
    wait = timeout + scan_budget + step_wait + STEP_HOOK_INSTALL_S
    fetched: Dict[str, DecodedTable] = {}

    def fetch(name: str) -> None:
        target.log(f"fetching {name}")
        table = client.fetch_table(name, params, wait)
        notes.extend(notes_on_what_is_read(table.notes, sql))
        fetched[name] = table

    # A process this CLI can look at from outside is asked something quick first (`ask`: a
    # silent agent is looked at after EARLY_LOOK_S, and a table that takes longer, at a step or
    # past a big heap, must not be taken for silence). A rank on another node cannot be looked at:
    # its first table goes at once, and its hello comes with it.
    if target.pid is None and not client.info:
        first = _named(list(AGENT_TABLES), sql)
        if first:
            fetch(first[0])
    described = described_in_hello(client.info)
    if described is None:
        answer, _ = ask(client, "tables", {}, timeout, target)
        described = list(answer["tables"])
    theirs = _named([table["name"] for table in described], sql)
    for name in theirs:
        if name not in LOCAL_TABLES and name not in fetched:
            fetch(name)
    return described, [fetched[name] for name in theirs if name in fetched]


def described_in_hello(info: Dict[str, Any]) -> Optional[List[Dict[str, Any]]]:
    """The agent's tables as its hello names them, described here, when the agent is this CLI's
    own version (whose schema is this one): a query then costs one round, not two. None when
    the hello came from another version, names a table unknown here, or has not come yet (it
    comes with the first answer)."""
    names = info.get("tables")
    if info.get("probing_version") != __version__ or not isinstance(names, list):
        return None
    if not all(isinstance(name, str) and name in AGENT_TABLES for name in names):
        return None
    return [AGENT_TABLES[name].describe() for name in names]


def fill(session: SqlSession, fetched: Fetched, constants: Optional[Dict[str, Any]] = None) -> None:
    for table in fetched.tables:
        session.load(table, constants)
    for schema, rows in fetched.rows:
        session.load_rows(schema, rows, constants)


def load_tables(
    target: Target, sql: str, timeout: float, scan_budget: float = 1.0, step_wait: float = 1.0
) -> LoadedTables:
    """Fetch the tables `sql` names into a new session; run the query with `.session.run(sql)`."""
    for view in referenced_tables(list(JOB_TABLES), sql):
        raise UsageError(
            f"{view} compares the ranks of a job: one process has only its own rows",
            hint=f'query it with --ranks all: probing PID query --ranks all "SELECT * FROM {view}"',
        )
    fetched = fetch_tables(target, sql, timeout, scan_budget, step_wait)
    if fetched.described is not None:
        session = SqlSession(fetched.described + local_tables_described())
    else:
        session = static_session()
    fill(session, fetched)
    return LoadedTables(session, fetched.pid, fetched.notes)


def _from_outside(
    target: Target, wanted: List[str], why: str, unreachable: bool, notes: List[str], timeout: float
) -> Tuple[Table, List[Any]]:
    """python.backtrace read from outside; other tables cannot be, and the error says why the
    agent did not give them: it went away (exit 1) or stayed silent (7)."""
    if target.remote:
        failure = AgentUnreachable if unreachable else AgentTimeout
        raise failure(f"{why}; {REMOTE_HINT}", hint="")
    if (
        target.pid is None
        or BACKTRACE.name not in wanted
        or any(name != BACKTRACE.name and name not in LOCAL_TABLES for name in wanted)
    ):
        failure = AgentUnreachable if unreachable else AgentTimeout
        raise failure(
            why, hint="only queries over python.backtrace (and process.stats) can be answered from outside"
        )
    stacks = from_outside(target, False, None, why, timeout)
    rows: List[Any] = [backtrace_values_of(row) for row in stacks.rows]
    notes.append(f"{why}; python.backtrace read from outside the process (py-spy)")
    return BACKTRACE, rows


def describe_tables(target: Target, timeout: float) -> List[Dict[str, Any]]:
    """Every table of the target (the agent's, then this side's) with its documented columns."""
    with target.connect(timeout) as client:
        return client.describe_tables() + local_tables_described()


class JobTables(NamedTuple):
    """One session over the tables of many ranks, each row with its rank's `rank`,
    `local_rank` and `node`; the ranks that could not give theirs, and notes by rank."""

    session: SqlSession
    missing: List[Missing]
    notes: List[str]


def load_job_tables(
    ranks: List[Rank],
    target_of: Callable[[Rank], Target],
    sql: str,
    timeout: float,
    attach_timeout: float,
    scan_budget: float = 1.0,
    step_wait: float = 1.0,
) -> JobTables:
    """The tables `sql` names, fetched from every rank at once and loaded into one session."""
    per_table = timeout + scan_budget + step_wait + STEP_HOOK_INSTALL_S
    tables = max(1, len(_named(_known_names(), sql)))
    deadline = attach_timeout + timeout + per_table * tables + outside_budget(timeout)
    gathered = gather(
        ranks, lambda rank: fetch_tables(target_of(rank), sql, timeout, scan_budget, step_wait), deadline
    )
    described = next((fetched.described for _, fetched in gathered.answers if fetched.described), None)
    if described is not None:
        session = SqlSession(described + local_tables_described(), RANK_COLUMNS)
    else:
        session = static_session(RANK_COLUMNS)
    # A note that several ranks give (each rank's `torch.cuda_memory is empty`) is said once.
    said: Dict[str, List[int]] = {}
    for rank, fetched in sorted(gathered.answers, key=lambda pair: pair[0].rank):
        fill(session, fetched, {"rank": rank.rank, "local_rank": rank.local_rank, "node": rank.node})
        for note in fetched.notes:
            said.setdefault(note, []).append(rank.rank)
    make_views(session.connection, list(session.tables))
    notes = [f"{_ranks_named(by, len(ranks))}: {note}" for note, by in said.items()]
    return JobTables(session, gathered.missing, notes)


def _ranks_named(ranks: List[int], chosen: int) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) == chosen:
        return "every rank"
    return "ranks " + rank_numbers(ranks)
