"""`stragglers`: every rank watched over the same window, each through its agent, on one
connection: its stacks sampled for the window, then its collectives of the window read from its
Flight Recorder (python.collectives); the analysis.stragglers verdict is made of them.

Before the window each rank is asked for python.process_groups: it costs the job nothing to
speak of (the recorder's progress counters, no entries), and where the job's torch records
nothing (TORCH_FR_BUFFER_SIZE=0) it starts the agent's own record of the collectives, so the
window has arrivals to compare. The Flight Recorder's entries (a dump of up to 2000 of them holds
the rank's GIL for tens of ms) are read after the window, so its cost falls outside it. A rank
whose agent cannot answer gives no arrivals: it is named missing, and judged by `hang`.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from ...analysis.rank_ranges import ranks_text
from ...analysis.stragglers import Arrival, RankWatched, Verdict, judge
from ...errors import AgentTimeout, ProbingError
from ...schema.tables import COLLECTIVES, PROCESS_GROUPS
from ..backtrace import ask
from ..flames.sampled import PING_TIMEOUT_S, sample_on
from ..target import Fallback, Target
from .fanout import gather
from .job import Rank

# Stack samples a second asked of each rank's agent (it paces itself to its cost share), and of
# the whole job: a job of many ranks shares them out (1 024 ranks on a node of few cores must
# not all sample at 100 Hz; the other ranks' mean share of each phase needs few of each).
SAMPLE_RATE_HZ = 100.0
JOB_SAMPLE_RATE_HZ = 400.0
MIN_SAMPLE_RATE_HZ = 2.0
# Beyond the window, what each rank may take: the first question, the dump, the answer.
RANK_SLACK_S = 10.0
# A table is asked for without waiting for a step (python.collectives needs none), and may take
# this much beyond --timeout: a copy of a full Flight Recorder holds the rank's GIL for tens of ms.
TABLE_PARAMS = {"scan_budget_s": 0.5, "step_wait_s": 0.0}
TABLE_SLACK_S = 2.0


class Watched(NamedTuple):
    arrivals: Optional[List[Arrival]]
    stacks: Optional[List[Any]]
    carrier: str
    notes: List[str]


class JobStragglers(NamedTuple):
    verdict: Verdict
    notes: List[str]  # "rank N: ..." (stacks it could not give, a Flight Recorder that was off)
    failure_code: Optional[int]  # when no rank could be watched: the first failure's exit code


def arrivals_of(rows: List[Dict[str, Any]]) -> List[Arrival]:
    """The collectives (not point-to-point) of python.collectives' rows, as arrivals."""
    arrivals = []
    for row in rows:
        at, seq = row.get("time_created"), row.get("seq")
        # A job's rows may say anything: a time that is no finite number is no arrival.
        if (
            row.get("is_p2p")
            or not isinstance(at, float)
            or not math.isfinite(at)
            or not isinstance(seq, int)
        ):
            continue
        pending = row.get("state") in ("scheduled", "started")
        arrivals.append(
            Arrival(str(row.get("pg_id")), seq, str(row.get("op")), str(row.get("input_sizes")), at, pending)
        )
    return arrivals


def _carrier(rows: List[Dict[str, Any]], stacks: Optional[List[Any]]) -> str:
    """The thread that issues the collectives: the one most rows name, where the samples know a
    thread of that name; else MainThread (the recorder names the OS thread, `python3` for the
    main thread, the samples its Python name)."""
    counts: Dict[str, int] = {}
    for row in rows:
        name = row.get("thread_name")
        if isinstance(name, str) and name:
            counts[name] = counts.get(name, 0) + 1
    sampled = {frames[0] for frames, _ in stacks or [] if frames}
    named = [name for name in sorted(counts, key=lambda name: -counts[name]) if name in sampled]
    return named[0] if named else "MainThread"


def _table_rows(client: Any, table: str, timeout: float) -> List[Dict[str, Any]]:
    decoded = client.fetch_table(table, TABLE_PARAMS, timeout + TABLE_SLACK_S)
    return list(decoded.to_rows())


def watch_rank(target: Target, duration: float, timeout: float, rate: float = SAMPLE_RATE_HZ) -> Watched:
    """One rank over the window, on one connection (a node's relay carries the requests of its
    ranks' connections together): its process groups, its stacks, then its collectives."""
    notes: List[str] = []
    stacks: Optional[List[Any]] = None
    with target.connect(timeout) as client:
        if not target.remote:  # a silent agent of this machine is found now, by a look from outside
            try:
                ask(client, "ping", {}, min(timeout, PING_TIMEOUT_S), target)
            except Fallback as fallback:
                raise AgentTimeout(f"its agent cannot answer: {fallback.why}", hint="") from None
        try:
            _table_rows(client, PROCESS_GROUPS.name, timeout)
        except ProbingError as error:
            notes.append(f"no process groups before the window: {error.message}")
        began = time.monotonic()
        try:
            # Its notes (samples left out for their cost, stacks cut) are about a picture's detail.
            stacks = list(sample_on(client, target, duration, rate, timeout).stacks)
        except (Fallback, ProbingError) as error:
            why = error.why if isinstance(error, Fallback) else error.message
            notes.append(f"its stacks could not be sampled: {why}")
            # Its collectives are still read at the window's end: read now, a collective it was
            # in would look waited in for the rest of the window (a CI run called a job stuck so).
            time.sleep(max(0.0, began + duration - time.monotonic()))
        rows = _table_rows(client, COLLECTIVES.name, timeout)
    if not any(row.get("source") == "flight_recorder" for row in rows):
        notes.append(
            "its torch's Flight Recorder holds nothing (TORCH_FR_BUFFER_SIZE=0?): probing's own record "
            "sees the collectives the job calls from Python, not DDP's gradient buckets"
        )
    return Watched(arrivals_of(rows), stacks, _carrier(rows, stacks), notes)


def watch_job(
    ranks: List[Rank],
    target_of: Callable[[Rank], Target],
    duration: float,
    timeout: float,
    attach_timeout: float,
) -> JobStragglers:
    """Watch every rank over `duration` seconds, then judge the job."""
    start = time.time()
    deadline = attach_timeout + duration + 3 * timeout + RANK_SLACK_S
    rate = max(MIN_SAMPLE_RATE_HZ, min(SAMPLE_RATE_HZ, JOB_SAMPLE_RATE_HZ / max(1, len(ranks))))
    gathered = gather(ranks, lambda rank: watch_rank(target_of(rank), duration, timeout, rate), deadline)
    views: List[RankWatched] = []
    said: Dict[str, List[int]] = {}  # a note several ranks give is said once, with their numbers
    for rank, watched in sorted(gathered.answers, key=lambda pair: pair[0].rank):
        views.append(RankWatched(rank.rank, rank.node, watched.arrivals, watched.stacks, watched.carrier))
        for note in watched.notes:
            said.setdefault(note, []).append(rank.rank)
    notes = [f"{ranks_text(numbers)}: {note}" for note, numbers in said.items()]
    for each in gathered.missing:
        views.append(
            RankWatched(each.rank.rank, each.rank.node, None, None, missing_reason=each.error.message)
        )
    failure = None if gathered.answers or not gathered.missing else int(gathered.missing[0].error.exit_code)
    return JobStragglers(judge(views, (start, start + duration)), notes, failure)
