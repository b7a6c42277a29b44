"""`hang --ranks`: every rank watched at once over the same window (engine/hang.py for each,
through its agent or from outside), then each rank's collectives from its Flight Recorder
(python.collectives, python.process_groups); analysis.collectives judges the job from them."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, List, NamedTuple, Optional, Sequence, cast

from ...analysis.collectives import JobVerdict, RankView, job_verdict
from ...analysis.mismatches import flight_recorder_analyzer
from ...errors import ProbingError
from ...schema.tables import COLLECTIVES, PROCESS_GROUPS
from ..hang import sample_hang
from ..query import fetch_tables
from ..sources import SourceLines
from ..target import Target
from .fanout import gather
from .job import Rank

if TYPE_CHECKING:
    from ...schema.rows import CollectivesRow, ProcessGroupsRow

COLLECTIVES_SQL = "SELECT * FROM python.collectives, python.process_groups"
# What one sample may take beyond the window: the agent's silence before a look from outside.
SAMPLE_SLACK_S = 1.5


class RankCollectives(NamedTuple):
    """A rank's python.collectives and python.process_groups rows; None for each it could not give."""

    collectives: Optional[List[CollectivesRow]] = None
    process_groups: Optional[List[ProcessGroupsRow]] = None


class RankHang(NamedTuple):
    report: Any  # analysis.progress.HangReport
    collectives: Optional[List[CollectivesRow]]
    process_groups: Optional[List[ProcessGroupsRow]]
    notes: List[str]


class JobHang(NamedTuple):
    verdict: JobVerdict
    notes: List[str]  # "rank N: ..." notes (why a rank was read from outside)
    # When no rank could be watched: the first failure's own exit code, as for one process.
    failure_code: Optional[int] = None


def collectives_of(target: Target, timeout: float) -> RankCollectives:
    """The rank's python.collectives and python.process_groups rows; None for each it could not
    give (its agent cannot answer while a thread holds the GIL, or its torch has no recorder)."""
    try:
        fetched = fetch_tables(target, COLLECTIVES_SQL, timeout, scan_budget=0.5, step_wait=0.0)
    except ProbingError as error:
        target.log(f"no collectives: {error.message}")
        return RankCollectives()
    # The rows as the schema types them: client/replies.py refused a table whose columns have
    # other types than the schema's.
    tables = {table.name: table.to_rows() for table in fetched.tables}
    collectives, groups = tables.get(COLLECTIVES.name), tables.get(PROCESS_GROUPS.name)
    return RankCollectives(
        None if collectives is None else cast("List[CollectivesRow]", collectives),
        None if groups is None else cast("List[ProcessGroupsRow]", groups),
    )


def _watch_rank(
    target: Target, duration: float, samples: int, timeout: float, carriers: Sequence[str]
) -> RankHang:
    # A remote rank's files are read here, where a shared file system usually has them too.
    sources = SourceLines(None if target.remote else target.require_pid("hang"))

    asked = (COLLECTIVES.name, PROCESS_GROUPS.name)
    answer = sample_hang(target, duration, samples, timeout, sources.frame_line, carriers, asked)
    if answer.tables is None:
        tables = collectives_of(target, timeout)
    else:  # read by the rank's agent after its window, in the same request
        tables = RankCollectives(
            cast("Optional[List[CollectivesRow]]", answer.tables.get(COLLECTIVES.name)),
            cast("Optional[List[ProcessGroupsRow]]", answer.tables.get(PROCESS_GROUPS.name)),
        )
    return RankHang(answer.report, tables.collectives, tables.process_groups, answer.notes)


def watch_job(
    ranks: List[Rank],
    target_of: Callable[[Rank], Target],
    duration: float,
    samples: int,
    timeout: float,
    attach_timeout: float,
    carriers: Sequence[str] = (),
) -> JobHang:
    """Watch every rank over `duration` seconds, then judge the job; `carriers`: the names of the
    threads that carry each rank (--thread), as for one process."""
    window_start = time.time()
    deadline = attach_timeout + duration + samples * SAMPLE_SLACK_S + 2 * timeout
    gathered = gather(
        ranks, lambda rank: _watch_rank(target_of(rank), duration, samples, timeout, carriers), deadline
    )
    views = []
    notes: List[str] = []
    for rank, watched in gathered.answers:
        views.append(
            RankView(
                rank.rank,
                rank.local_rank,
                rank.node,
                rank.pid,
                watched.report,
                "",
                watched.collectives,
                watched.process_groups,
                rank.host if rank.remote else None,
            )  # fmt: skip
        )
        notes.extend(f"rank {rank.rank}: {note}" for note in watched.notes)
    for each in gathered.missing:
        rank = each.rank
        views.append(
            RankView(
                rank.rank,
                rank.local_rank,
                rank.node,
                rank.pid or None,
                None,
                each.error.message,
                host=rank.host if rank.remote else None,
            )  # fmt: skip
        )
    failure = None if gathered.answers or not gathered.missing else int(gathered.missing[0].error.exit_code)
    return JobHang(judge(views, window_start), notes, failure)


def judge(views: List[RankView], window_start: float) -> JobVerdict:
    """analysis.collectives' verdict, with torch's Flight Recorder analyzer deciding a mismatch of
    collectives where torch can be imported (imported only then: analysis/mismatches.py)."""
    return job_verdict(views, window_start, flight_recorder_analyzer)
