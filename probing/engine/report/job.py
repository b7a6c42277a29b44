"""What `probing PID report --ranks` shows of a whole job, gathered: plain data, no HTML
(cli/pictures/report_job.py draws it).

The order is that of the single report (engine/report/live.py), for every rank at once: the stacks
first (backtrace --ranks' way: from each agent, or from outside where it cannot answer), then,
from the ranks whose agents answered, every table the page reads in one session with `rank`,
`local_rank` and `node` columns (query.load_job_tables), then the job's hang verdict over a
short window (job_hang.watch_job, the one `hang --ranks` prints), and from the collectives that
watch read, `stragglers`' verdict without its phases (analysis/stragglers.py). A rank that gives no stacks is
asked nothing more: it is named at the top of the page, and the command exits PARTIAL.

Bounded for a job of many ranks: the charts' points are shared out among the ranks (each rank's
last steps and memory points, JOB_STEP_POINTS and JOB_MEMORY_POINTS in all, at least
MIN_POINTS_PER_RANK each), cut in SQL (report_tables); threads folded within a rank and then
across ranks, at most THREADS_SHOWN entries drawn.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Tuple, cast

from ...analysis.collectives import JobVerdict, main_thread
from ...analysis.stragglers import RankWatched
from ...analysis.stragglers import Verdict as StragglersVerdict
from ...analysis.stragglers import judge as judge_stragglers
from ...errors import ProbingError
from ...sql.session import SqlSession
from ..backtrace import Stacks, read_stacks_of_ranks, stacks_deadline
from ..jobs.fanout import Missing
from ..jobs.hang import watch_job
from ..jobs.job import Job, Rank
from ..jobs.stragglers import arrivals_of
from ..query import load_job_tables
from ..target import Target
from .live import judged_threads
from .sources import ReportSources
from .tables import held_tables, memory_history, step_times
from .threads import THREADS_SHOWN, fold_threads, stack_key

if TYPE_CHECKING:
    from ...schema.rows import BacktraceRow

# The collectives of each rank's Flight Recorder the page's straggler verdict reads: the last minute.
STRAGGLERS_WINDOW_S = 60.0
JOB_TABLES_SQL = "SELECT 1 FROM python.process_groups, process.memory, python.torch_trace"
# The charts' points for the whole job: 64 ranks get 100 steps and 120 memory points each, a
# page of about 1.3 MB (2.3 MB when no two ranks share a stack); more ranks get fewer each.
JOB_STEP_POINTS = 6400
JOB_MEMORY_POINTS = 7680
# What a rank's line needs to be read at all, however many ranks.
MIN_POINTS_PER_RANK = 10
STEPS_PER_RANK = 100
MEMORY_POINTS_PER_RANK = 120


def points_per_rank(ranks: int) -> Tuple[int, int]:
    """Steps and memory points drawn of each rank."""
    count = max(1, ranks)
    return (
        max(MIN_POINTS_PER_RANK, min(STEPS_PER_RANK, JOB_STEP_POINTS // count)),
        max(MIN_POINTS_PER_RANK, min(MEMORY_POINTS_PER_RANK, JOB_MEMORY_POINTS // count)),
    )


# Per rank: traced steps, the newest RSS, and its default group's (else first group's) progress.
_RANK_FIGURES_SQL = {
    "python.torch_trace": (
        "SELECT rank, count(DISTINCT step) AS steps_traced FROM python.torch_trace GROUP BY rank"
    ),
    "process.memory": "SELECT rank, arg_max(rss_mb, ts) AS rss_mb FROM process.memory GROUP BY rank",
    # One row per rank, all from the same group (arg_min would skip NULLs column by column).
    "python.process_groups": """
SELECT rank, last_enqueued, last_completed, pg_desc FROM python.process_groups
QUALIFY row_number() OVER (
  PARTITION BY rank
  ORDER BY pg_desc IS DISTINCT FROM 'default_pg', TRY_CAST(pg_id AS BIGINT) NULLS LAST, pg_id
) = 1""",
}


class JobReport(NamedTuple):
    """Everything the job's page shows; a section whose data is empty (or None) is left out."""

    job: Dict[str, Any]  # name, run_id, launcher_pid, world_size, asked (ranks chosen)
    ranks: List[Dict[str, Any]]  # the ranks that answered, by rank: one row of the ranks table each
    missing: List[Missing]  # ranks that gave no answer, and why (stacks, tables or the hang watch)
    verdict: Optional[JobVerdict]  # the job's hang verdict (None: not asked, or it failed)
    steps: List[Dict[str, Any]]  # rank, step, seconds, traced_s: each rank's oldest first
    memory: List[Dict[str, Any]]  # rank, ts, rss_mb, cuda_allocated_mb, ...: each rank's oldest first
    threads: List[
        Dict[str, Any]
    ]  # report_threads' entries, each with the `ranks` (numbers) and `on` (Ranks) it is on
    thread_count: int  # threads of every rank that answered
    threads_left_out: int
    outside: List[int]  # ranks whose stacks were read from outside (py-spy): no tables from them
    absent: Dict[str, str]  # section -> why it is not on the page
    notes: List[str]
    timings: Dict[str, float]
    generated_at: float
    # Who the job waits for, from the ranks' Flight Recorders as the hang watch read them (None:
    # the watch did not run, or the job is hung).
    stragglers: Optional[StragglersVerdict] = None


def _job_fields(job: Job, chosen: List[Rank]) -> Dict[str, Any]:
    return {"name": job.name(), "run_id": job.run_id, "launcher_pid": job.launcher,
            "world_size": job.world_size, "asked": [rank.rank for rank in chosen]}  # fmt: skip


def _figures(session: SqlSession, held: List[str]) -> Dict[int, Dict[str, Any]]:
    figures: Dict[int, Dict[str, Any]] = {}
    for table, sql in _RANK_FIGURES_SQL.items():
        if table not in held:
            continue
        result = session.run(sql)
        for row in result.rows:
            figures.setdefault(int(row[0]), {}).update(zip(result.columns[1:], row[1:]))
    return figures


def fold_ranks(per_rank: List[Tuple[Rank, List[Dict[str, Any]]]]) -> Tuple[List[Dict[str, Any]], int]:
    """Each rank's threads folded (report_threads.fold_threads), then the same entry on several
    ranks made one, with the `ranks` (numbers) and `on` (Rank objects) it stands for, and each
    rank's own ids and CPU time (`per_rank`): main threads first, then a thread holding the GIL,
    then by the first rank. At most THREADS_SHOWN entries; also how many threads the entries
    left out stood for."""
    entries: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    left_out = 0
    for rank, threads in sorted(per_rank, key=lambda pair: pair[0].rank):
        shown, more = fold_threads(threads)
        left_out += more
        for entry in shown:
            key = (entry["is_main"], entry["count"], stack_key(entry))
            own = {"rank": rank.rank, "thread_id": entry.get("thread_id"),
                   "native_id": entry.get("native_id"), "cpu_s": entry.get("cpu_s")}  # fmt: skip
            if key in entries:
                entries[key]["ranks"].append(rank.rank)
                entries[key]["on"].append(rank)
                entries[key]["per_rank"].append(own)
            else:
                entries[key] = dict(entry, ranks=[rank.rank], on=[rank], per_rank=[own])
    # The odd one out first: of the main threads, those on fewest ranks (a straggler's own).
    ordered = sorted(entries.values(), key=lambda entry: (not entry["is_main"],
                     "GIL" not in str(entry.get("state") or ""), len(entry["ranks"]),
                     entry["ranks"][0]))  # fmt: skip
    rest = ordered[THREADS_SHOWN:]
    return ordered[:THREADS_SHOWN], left_out + sum(entry["count"] * len(entry["ranks"]) for entry in rest)


def _rank_row(
    rank: Rank, threads: List[Dict[str, Any]], source: str, verdict: Optional[JobVerdict],
    figures: Dict[str, Any], last_step: Optional[Dict[str, Any]],
) -> Dict[str, Any]:  # fmt: skip
    """The ranks table's row: where its main thread is (as the hang watch saw it, when it did)."""
    view = next((view for view in verdict.ranks if view.rank == rank.rank), None) if verdict else None
    watched = main_thread(view.report) if view is not None and view.report is not None else None
    main = next((thread for thread in threads if thread["is_main"]), None)
    return {
        "rank": rank.rank, "local_rank": rank.local_rank, "node": rank.node, "pid": rank.pid,
        "host": rank.host if rank.remote else None, "source": source,
        "where": watched.where if watched else main["where"] if main else None,
        "state": watched.state if watched else main["state"] if main else None,
        "activity": watched.activity if watched else None,
        "hung": view.report.hung if view is not None and view.report is not None else None,
        "last_enqueued": figures.get("last_enqueued"), "last_completed": figures.get("last_completed"),
        "pg_desc": figures.get("pg_desc"), "steps_traced": figures.get("steps_traced"),
        "last_step_s": None if last_step is None else last_step.get("seconds"),
        "rss_mb": figures.get("rss_mb"),
    }  # fmt: skip


def _read_rank_tables(
    agents: List[Rank], target_of: Callable[[Rank], Target], timeout: float, attach_timeout: float,
    missing: List[Missing], notes: List[str], absent: Dict[str, str], timings: Dict[str, float],
) -> Tuple[Optional[SqlSession], List[str]]:  # fmt: skip
    """One session over the tables of the ranks whose agents answered (None: none did, or it
    failed), and which of the figures' tables hold rows. Ranks lost on the way join `missing`."""
    if not agents:
        return None, []
    begun = time.monotonic()
    session: Optional[SqlSession] = None
    held: List[str] = []
    try:
        tables = load_job_tables(agents, target_of, JOB_TABLES_SQL, timeout, attach_timeout)
    except ProbingError as error:
        absent["tables"] = f"the ranks' tables could not be read: {error.message}"
    else:
        session = tables.session
        held = sorted(held_tables(session, list(_RANK_FIGURES_SQL)))
        missing.extend(tables.missing)
        notes.extend(note for note in tables.notes if note not in notes)
    timings["tables_s"] = time.monotonic() - begun
    return session, held


def _watch_for_hang(
    watched_ranks: List[Rank], target_of: Callable[[Rank], Target], hang_duration: float,
    hang_samples: int, timeout: float, attach_timeout: float, missing: List[Missing], notes: List[str],
    timings: Dict[str, float],
) -> Optional[JobVerdict]:  # fmt: skip
    """The job's hang verdict (None: `hang_duration` 0); ranks the watch lost join `missing`."""
    if hang_duration <= 0:
        return None
    begun = time.monotonic()
    watched = watch_job(watched_ranks, target_of, hang_duration, hang_samples, timeout, attach_timeout)
    verdict = watched.verdict
    notes.extend(note for note in watched.notes if note not in notes)
    by_number = {rank.rank: rank for rank in watched_ranks}
    for lost in verdict.missing:
        missing.append(Missing(by_number[lost.rank], ProbingError(lost.reason, hint="")))
    timings["hang_s"] = time.monotonic() - begun
    return verdict


def _threads_and_rows(
    answered: List[Tuple[Rank, Stacks]], outside: List[int], verdict: Optional[JobVerdict],
    steps: List[Dict[str, Any]], figures: Dict[int, Dict[str, Any]],
) -> Tuple[List[Tuple[Rank, List[Dict[str, Any]]]], List[Dict[str, Any]]]:  # fmt: skip
    """Each rank's threads, as the hang watch judged them where it did, and its row of the
    ranks table."""
    judged = {
        view.rank: {(thread.thread_id, thread.native_id): thread for thread in view.report.threads}
        for view in (verdict.ranks if verdict else [])
        if view.report is not None
    }
    local = next((rank.pid for rank, _ in answered if not rank.remote and rank.pid), None)
    sources = ReportSources(local)  # every rank runs the same code: one reader of its files

    def code_line(frame: BacktraceRow) -> str:
        return sources.line(str(frame.get("file")), frame.get("lineno"))

    per_rank = []
    rows = []
    for rank, read in answered:
        threads = judged_threads(read, code_line, judged.get(rank.rank, {}))
        per_rank.append((rank, threads))
        last = next((step for step in reversed(steps) if step["rank"] == rank.rank
                     and step.get("seconds") is not None), None)  # fmt: skip
        source = "py-spy" if rank.rank in outside else "agent"
        rows.append(_rank_row(rank, threads, source, verdict, figures.get(rank.rank, {}), last))
    return per_rank, rows


def gather_job(
    job: Job, chosen: List[Rank], target_of: Callable[[Rank], Target], timeout: float,
    attach_timeout: float, hang_duration: float, hang_samples: int,
) -> JobReport:  # fmt: skip
    """The job's report over the `chosen` ranks; `hang_duration` 0 leaves the verdict out. A rank
    that does not answer is in `missing`; when none answers, the first one's error is raised."""
    started = time.monotonic()
    timings: Dict[str, float] = {}
    notes: List[str] = []
    absent: Dict[str, str] = {}
    stacks = read_stacks_of_ranks(chosen, target_of, False, None, timeout,
                                  stacks_deadline(timeout, attach_timeout))  # fmt: skip
    timings["stacks_s"] = time.monotonic() - started
    if not stacks.answers:
        raise stacks.missing[0].error
    missing = list(stacks.missing)
    answered = sorted(stacks.answers, key=lambda pair: pair[0].rank)
    for rank, read in answered:
        notes.extend(f"rank {rank.rank}: {note}" for note in read.notes)
    outside = [
        rank.rank for rank, read in answered if any(row.get("source") == "py-spy" for row in read.rows)
    ]
    agents = [rank for rank, _ in answered if rank.rank not in outside]
    session, held = _read_rank_tables(
        agents, target_of, timeout, attach_timeout, missing, notes, absent, timings
    )
    if outside:
        absent["outside"] = (
            f"{_ranks_word(outside)} gave no answer through "
            f"{'its agent' if len(outside) == 1 else 'their agents'} (the notes at the"
            " foot of the page say why): stacks read from outside (py-spy), and no"
            " steps, memory or collectives from them"
        )
    verdict = _watch_for_hang([rank for rank, _ in answered], target_of, hang_duration, hang_samples,
                              timeout, attach_timeout, missing, notes, timings)  # fmt: skip
    stragglers = _stragglers(verdict)
    steps_each, memory_each = points_per_rank(len(answered))
    steps = step_times(session, "rank", steps_each) if session is not None else []
    memory = memory_history(session, "rank", memory_each) if session is not None else []
    if session is not None and not steps:
        absent["steps"] = (
            f"no traced steps on any rank: `probing {job.launcher or 'PID'} trace on --ranks all` "
            "records them (per module, forward and backward)"
        )
    figures = _figures(session, held) if session is not None else {}
    per_rank, rows = _threads_and_rows(answered, outside, verdict, steps, figures)
    shown, left_out = fold_ranks(per_rank)
    timings["total_s"] = time.monotonic() - started
    return JobReport(
        job=_job_fields(job, chosen), ranks=rows, missing=_first_per_rank(missing), verdict=verdict,
        steps=steps, memory=memory, threads=shown,
        thread_count=sum(len(threads) for _, threads in per_rank), threads_left_out=left_out,
        outside=outside, absent=absent, notes=notes, timings=timings, generated_at=time.time(),
        stragglers=stragglers,
    )  # fmt: skip


def _stragglers(verdict: Optional[JobVerdict]) -> Optional[StragglersVerdict]:
    """`stragglers`' verdict from the collectives the hang watch read from each rank, over the last
    STRAGGLERS_WINDOW_S (no stack samples: the phase is `stragglers`' to say)."""
    if verdict is None or verdict.hung:
        return None
    # The collectives that completed: whether the job is stuck is the hang section's to say (a
    # collective pending when read is no arrival to judge, the report's own look may delay one).
    watched = [
        RankWatched(view.rank, view.node, _completed(cast("List[Dict[str, Any]]", view.collectives)), None)
        for view in verdict.ranks
        if view.collectives is not None
    ]
    now = time.time()
    return judge_stragglers(watched, (now - STRAGGLERS_WINDOW_S, now)) if len(watched) > 1 else None


def _completed(rows: List[Dict[str, Any]]) -> List[Any]:
    return [arrival for arrival in arrivals_of(rows) if not arrival.pending]


def _first_per_rank(missing: List[Missing]) -> List[Missing]:
    """A rank that failed twice (its tables, then the hang watch) is named once, for the first."""
    seen: Dict[int, Missing] = {}
    for each in missing:
        seen.setdefault(each.rank.rank, each)
    return sorted(seen.values(), key=lambda each: each.rank.rank)


def _ranks_word(numbers: List[int]) -> str:
    return f"rank {numbers[0]}" if len(numbers) == 1 else "ranks " + ",".join(str(n) for n in numbers)
