"""The rows a timeline is drawn from (`probing TARGET trace export`): python.torch_trace of the
steps asked for, python.nan_events of those steps and process.memory over their time, read with
SQL from one live target, from every chosen rank at once, or from a record; streamed from
DuckDB in batches so a million rows are never Python tuples all at once."""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Tuple

from ..errors import ProbingError
from ..sql.session import SqlSession
from .jobs.fanout import Missing
from .jobs.job import Rank
from .query import load_job_tables, load_tables
from .records.record import Record
from .requests import switch
from .target import Target

# The tables a timeline reads: naming them is how load_tables knows what to fetch.
TABLES = "python.torch_trace python.nan_events process.memory"
BATCH_ROWS = 20_000
# process.memory is sampled every second: a second either side of the steps gives the counter
# a value where the first step starts and where the last one ends.
MEMORY_MARGIN_US = 1_000_000


class StepRange(NamedTuple):
    """--steps A:B, both ends included; None: open on that side."""

    first: Optional[int]
    last: Optional[int]

    def condition(self) -> str:
        parts = []
        if self.first is not None:
            parts.append(f"step >= {int(self.first)}")
        if self.last is not None:
            parts.append(f"step <= {int(self.last)}")
        return " AND ".join(parts) or "true"

    def describe(self) -> str:
        first = "" if self.first is None else str(self.first)
        last = "" if self.last is None else str(self.last)
        return first if self.first is not None and self.first == self.last else f"{first}:{last}"


EVERY_STEP = StepRange(None, None)


def parse_steps(text: str) -> StepRange:
    """'A:B', 'A:', ':B' or 'N' (steps A to B, both included); ValueError otherwise. The one
    reading of --steps, for `trace export` and `flamegraph --torch`: ASCII digits only (not
    '1_0', '-3', '²' or other scripts' digits), '' is no range, ':' is every step."""

    def number(part: str) -> Optional[int]:
        part = part.strip()
        if not part:
            return None
        if not re.fullmatch("[0-9]+", part):
            raise ValueError(f"{part!r} is not a step number (steps count from 0)")
        return int(part)

    if ":" not in text:
        single = number(text)
        if single is None:
            raise ValueError("empty step range")
        return StepRange(single, single)
    if text.count(":") > 1:
        raise ValueError(f"{text!r} has more than one ':'")
    first, last = (number(part) for part in text.split(":"))
    if first is not None and last is not None and first > last:
        raise ValueError(f"{text!r} ends before it starts")
    return StepRange(first, last)


class TimelineRows(NamedTuple):
    """A session holding the tables of one or many processes, each row's process in `process`
    ("rank" with --ranks, 0 for one target); `processes`: (process key, pid, name) of each."""

    session: SqlSession
    process_column: str
    steps: StepRange
    processes: List[Tuple[int, int, str]]
    notes: List[str]
    missing: List[Missing]

    def trace_rows(self) -> Iterator[Tuple[Any, ...]]:
        return _stream(self.session, _trace_sql(self.process_column, self.steps))

    def nan_rows(self) -> Iterator[Tuple[Any, ...]]:
        sql = (
            f"SELECT {self.process_column} AS process, step, seq, module, module_type, stage, tensor, "
            f"nan_count, inf_count, input_finite, epoch_us(ts) FROM python.nan_events "
            f"WHERE {self.steps.condition()} ORDER BY 1, ts"
        )
        return _stream(self.session, sql)

    def memory_rows(self) -> Iterator[Tuple[Any, ...]]:
        process = self.process_column
        sql = (
            f"WITH bounds AS (SELECT {process} AS process, min(epoch_us(ts)) AS low, "
            f"max(epoch_us(ts) + CAST(round(duration * 1000000) AS BIGINT)) AS high "
            f"FROM python.torch_trace WHERE {self.steps.condition()} AND isfinite(duration) GROUP BY 1) "
            f"SELECT memory.process, epoch_us(memory.ts), memory.rss_mb "
            f"FROM (SELECT {process} AS process, ts, rss_mb FROM process.memory) AS memory "
            f"JOIN bounds ON memory.process = bounds.process "
            f"WHERE epoch_us(memory.ts) BETWEEN low - {MEMORY_MARGIN_US} AND high + {MEMORY_MARGIN_US} "
            f"ORDER BY 1, 2"
        )
        return _stream(self.session, sql)


def _trace_sql(process: str, steps: StepRange) -> str:
    return (
        f"SELECT {process} AS process, step, seq, module, module_type, stage, duration, time_offset, "
        f"allocated, max_allocated, reserved, epoch_us(ts) FROM python.torch_trace "
        f"WHERE {steps.condition()} ORDER BY 1, step, seq"
    )


def _stream(session: SqlSession, sql: str) -> Iterator[Tuple[Any, ...]]:
    """The query's rows in batches. It runs when first read, on the session's one connection,
    where a new query ends the previous one's results: read each stream to its end first."""
    cursor = session.connection.execute(sql)
    while True:
        batch = cursor.fetchmany(BATCH_ROWS)
        if not batch:
            return
        yield from batch


def _check_rows(session: SqlSession, steps: StepRange, empty: Callable[[], ProbingError]) -> None:
    """Refuse an export with nothing in it: `empty()` says why the table is empty; steps asked for
    that hold nothing get the steps there are."""
    found = session.connection.execute(
        f"SELECT count(*), count(*) FILTER (WHERE {steps.condition()}), min(step), max(step), "
        "count(DISTINCT step) FROM python.torch_trace"
    ).fetchone()
    assert found is not None
    total, chosen, first, last, traced = found
    if total == 0:
        raise empty()
    if chosen == 0:
        raise ProbingError(
            f"python.torch_trace holds {traced} traced steps from {first} to {last}, "
            f"none of --steps {steps.describe()}",
            hint=f"--steps {first}:{last} takes them all (tracing may take one step in N: `trace status`)",
        )


EMPTY_HINT = "`probing {target} trace on` first, let the job run a few steps, then export"


def live_timeline(target: Target, steps: StepRange, timeout: float) -> TimelineRows:
    """The rows of one live process."""
    loaded = load_tables(target, f"SELECT * FROM {TABLES}", timeout)
    pid = loaded.pid or target.pid or 0

    def empty() -> ProbingError:
        # Why it is empty: no torch (NoTorch says so), tracing off, or no traced step yet.
        status = switch(target, "trace", {"action": "status"}, timeout)
        state = status.get("status")  # the agent's answer: {"status": {...}, "hooks_before": ...}
        if isinstance(state, dict) and state.get("trace"):
            return ProbingError(
                "python.torch_trace has no rows yet: tracing is on, but no traced call has ended",
                hint="let the job run a step, then export again",
            )
        return ProbingError(
            f"python.torch_trace is empty: tracing is off in PID {pid}", hint=EMPTY_HINT.format(target=pid)
        )

    _check_rows(loaded.session, steps, empty)
    return TimelineRows(loaded.session, "0", steps, [(0, pid, f"PID {pid}")], loaded.notes, [])


def job_timeline(
    ranks: List[Rank],
    target_of: Callable[[Rank], Target],
    steps: StepRange,
    timeout: float,
    attach_timeout: float,
) -> TimelineRows:
    """The rows of every chosen rank, fetched at once; a process per rank."""
    tables = load_job_tables(ranks, target_of, f"SELECT * FROM {TABLES}", timeout, attach_timeout)
    failed = {missing.rank.rank for missing in tables.missing}
    chosen = [rank for rank in ranks if rank.rank not in failed]
    if not chosen:
        error = tables.missing[0].error if tables.missing else ProbingError("no rank answered", hint="")
        raise error
    pids = [rank.pid for rank in chosen]
    unique = len(set(pids)) == len(pids) and all(pid is not None for pid in pids)
    processes = []
    for rank in sorted(chosen, key=lambda rank: rank.rank):
        where = f"PID {rank.pid}" if not rank.remote else f"{rank.endpoint}"
        processes.append(
            (rank.rank, rank.pid if unique and rank.pid else rank.rank, f"rank {rank.rank} ({where})")
        )

    def empty() -> ProbingError:
        return ProbingError(
            "python.torch_trace is empty on every rank that answered: tracing is off",
            hint="`probing PID trace on --ranks all` first, let the job run a few steps, then export",
        )

    _check_rows(tables.session, steps, empty)
    return TimelineRows(tables.session, "rank", steps, processes, tables.notes, tables.missing)


def record_timeline(record: Record, steps: StepRange) -> TimelineRows:
    """The rows a record holds (a record of a job that traced: PROBING_TORCH_TRACE=1, or trace on)."""
    from .records.sql import notes_about, record_session  # DuckDB, ~60 ms: for records alone

    session = record_session(record)
    pid = record.pid or 0

    def empty() -> ProbingError:
        held = "holds no python.torch_trace" if "python.torch_trace" not in record.table_names() else (
            "holds an empty python.torch_trace")  # fmt: skip
        return ProbingError(
            f"{record.path} {held}: the job was not tracing when it was recorded",
            hint="trace the job (`probing PID trace on`, or PROBING_TORCH_TRACE=1) before it is recorded",
        )

    _check_rows(session, steps, empty)
    notes = notes_about(record.notes, ["python.torch_trace"])  # the one table it reads
    return TimelineRows(session, "0", steps, [(0, pid, f"PID {pid} (record)")], notes, [])
