"""`probing run --hang-timeout S`: end a CI job that stopped progressing, with every stack.

Progress is analysis.progress's definition, the one `probing PID hang` uses: a thread that
carries the job (of the job, or of its first Python descendant when the job is a shell script)
moved or used the CPU; those named with `--thread` carry it once one of them is there. When the
command starts a distributed job (`probing run -- torchrun ...`), every rank is watched, and the
job is judged as `hang --ranks all` judges it (analysis.collectives): once a rank has made no
progress for S seconds, the ranks' collectives decide whether the job is stuck, and the verdict
(which rank is behind, who waits in what) goes into the report.

The watchdog samples the stacks through the engine (the agent, or py-spy when it
cannot answer); after S seconds without progress it reads every stack of the process tree,
asks every agent of the tree for a record (the job's tables and stacks, kept in a file after it
is gone: docs/records.md), hands stacks and record paths to its caller (`on_hung`: cli/run.py
prints them and writes the JSON report), then terminates the tree (SIGTERM, then SIGKILL after
5 s) and makes `probing run` exit 11.

It never prints.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..analysis.collectives import JobVerdict, RankView
from ..analysis.progress import HangReport, ProgressTracker
from ..engine.backtrace import Stacks, read_stacks, stacks_deadline
from ..engine.hang import take_sample
from ..engine.jobs.fanout import gather
from ..engine.jobs.hang import RankCollectives, collectives_of, judge
from ..engine.jobs.job import Job, NotAJob, Rank, find_job
from ..engine.processes import descendants, first_python
from ..engine.sources import SourceLines
from ..engine.target import Target
from ..errors import ExitCode, NoAgent, ProbingError
from ..procfs import process_alive

# Seconds each look at the stacks may wait for the agent before reading from outside.
SAMPLE_TIMEOUT_S = 2.0
# After SIGTERM, how long the tree has to exit before SIGKILL.
TERMINATE_GRACE_S = 5.0
# How long the agents of the tree, together, may take to write their records before the tree
# is ended anyway (a record of a 1 M-row trace takes about a second).
RECORD_TIMEOUT_S = 10.0


class RecordOutcome(NamedTuple):
    """What one process's agent answered when asked for a record before the end."""

    pid: int
    path: Optional[str]
    error: Optional[str]


class HungJob(NamedTuple):
    """What the watchdog saw when it gave up on the job."""

    stalled_s: float
    # Per process of the tree: (pid, its stacks with the innermost frames' locals, or the
    # error that kept them from being read).
    processes: List[Tuple[int, Optional[Stacks], Optional[ProbingError]]]
    job: Optional[JobVerdict] = None  # a distributed job's verdict (which rank is behind)
    # The record each agent of the tree wrote (or why not); processes without an agent left out.
    records: Tuple[RecordOutcome, ...] = ()
    # The verdict on the process (analysis.progress: which threads decided it and why); the
    # job's verdict says it for a distributed job.
    reason: str = ""


class Watchdog:
    def __init__(
        self,
        pid: int,
        timeout: float,
        on_hung: Callable[[HungJob], None],
        log: Optional[Callable[[str], None]] = None,
        carriers: Sequence[str] = (),
    ) -> None:
        self.pid = pid
        self.carriers = carriers  # --thread: the names of the threads that carry the job
        self.timeout = timeout
        self.on_hung = on_hung
        self.log = log
        self.interval = min(max(timeout / 10, 0.2), 5.0)
        self.tracker: Optional[ProgressTracker] = None
        self.rank_trackers: Dict[int, ProgressTracker] = {}  # by rank's PID, for a distributed job
        self.job: Optional[Job] = None

    def _target(self, pid: int) -> Target:
        # The job was started with the agent in it: never attach (a process without one is
        # read from outside).
        return Target(str(pid), self.log, no_attach=True)

    def _stacks(self, pid: int, with_locals: bool = False) -> Stacks:
        return read_stacks(self._target(pid), with_locals, None, SAMPLE_TIMEOUT_S)

    def _job(self) -> Optional[Job]:
        """The distributed job the command started, if it did: kept from the last tick once it
        is whole, found again while a rank of this node is missing (torchrun still starting
        them, a loaded machine) or when one has gone (a restart)."""
        kept = self.job
        if kept is not None and not kept.absent and all(process_alive(rank.pid) for rank in kept.ranks):
            return kept
        try:
            job: Optional[Job] = find_job(self.pid)
        except (NotAJob, ProbingError):
            job = None
        self.job = job if job is not None and job.ranks else None
        if self.job is not None:  # trackers of ranks that are gone
            live = {rank.pid for rank in self.job.ranks}
            self.rank_trackers = {pid: tracker for pid, tracker in self.rank_trackers.items() if pid in live}
        return self.job

    def _tracker(self, pid: int) -> ProgressTracker:
        # Source lines tell a wait line (time.sleep in a polling loop) from work, as in `hang`.
        sources = SourceLines(pid)
        return ProgressTracker(pid, sources.frame_line, self.carriers)

    def tick(self) -> Optional[int]:
        """Take one sample; ExitCode.HUNG once the job has been stalled for the timeout (the
        tree is ended by then), None while it progresses."""
        job = self._job()
        if job is not None:
            return self._tick_job(job)
        pid = first_python(self.pid)
        try:
            stacks = self._stacks(pid)
        except ProbingError:
            return None  # not started yet, or between processes: no verdict
        if self.tracker is None or self.tracker.pid != pid:
            self.tracker = self._tracker(pid)
        report = self.tracker.add(take_sample(pid, stacks.rows, stacks.info, stacks.tasks))
        stalled = self.tracker.stalled_s(time.monotonic())
        if not report.hung or stalled < self.timeout:
            return None
        return self._give_up(stalled, None, report.reason)

    def _tick_job(self, job: Job) -> Optional[int]:
        """One sample of every rank; once a rank has been stalled for the timeout, the job's
        verdict over that window decides (collectives completing on every rank forgive it)."""
        now = time.monotonic()
        # The agent's share, then a read from outside if a rank's agent stays silent (no attach).
        gathered = gather(
            job.ranks, lambda rank: self._stacks(rank.pid), stacks_deadline(SAMPLE_TIMEOUT_S, 0.0)
        )
        reports: Dict[int, Tuple[Rank, HangReport]] = {}
        for rank, stacks in gathered.answers:
            tracker = self.rank_trackers.get(rank.pid)
            if tracker is None:
                tracker = self.rank_trackers[rank.pid] = self._tracker(rank.pid)
            sample = take_sample(rank.pid, stacks.rows, stacks.info, stacks.tasks)
            reports[rank.rank] = (rank, tracker.add(sample))
        stalled = max(
            (self.rank_trackers[rank.pid].stalled_s(now) for rank, report in reports.values() if report.hung),
            default=0.0,
        )
        if stalled < self.timeout:
            return None
        window_start = time.time() - stalled
        tables = gather(
            job.ranks, lambda rank: collectives_of(self._target(rank.pid), SAMPLE_TIMEOUT_S), 10.0
        )
        found = {rank.rank: each for rank, each in tables.answers}
        views = [
            RankView(
                rank.rank,
                rank.local_rank,
                rank.node,
                rank.pid,
                report,
                "",
                found.get(rank.rank, RankCollectives()).collectives,
                found.get(rank.rank, RankCollectives()).process_groups,
            )  # fmt: skip
            for rank, report in reports.values()
        ]
        views += [
            RankView(
                each.rank.rank,
                each.rank.local_rank,
                each.rank.node,
                each.rank.pid or None,
                None,
                each.error.message,
            )  # fmt: skip
            for each in gathered.missing
        ]
        verdict = judge(views, window_start)
        if not verdict.hung:
            for tracker in self.rank_trackers.values():
                tracker.progressed()
            return None
        return self._give_up(stalled, verdict)

    def _give_up(self, stalled: float, verdict: Optional[JobVerdict], reason: str = "") -> int:
        """Read every stack of the tree, ask its agents for records, hand it all to `on_hung`,
        then end the tree: ended even when `on_hung` fails (its reader went away mid-verdict)."""
        tree = [self.pid] + [child for child, _ in descendants(self.pid)]
        try:
            looks = [self._last_look(each) for each in tree]
            self.on_hung(HungJob(stalled, looks, verdict, self._records(tree, stalled), reason))
        finally:
            self._end(tree)
        return ExitCode.HUNG

    def _last_look(self, pid: int) -> Tuple[int, Optional[Stacks], Optional[ProbingError]]:
        try:
            stacks = self._stacks(pid, with_locals=True)
        except ProbingError as error:
            return pid, None, error
        # Locals of the innermost frame of each thread only: what it is stuck on.
        stacks.rows = [{**row, "locals": row["locals"] if row["depth"] == 0 else None} for row in stacks.rows]
        return pid, stacks, None

    def _records(self, tree: List[int], stalled: float) -> Tuple[RecordOutcome, ...]:
        """Ask every agent of the tree for a record, in parallel, within RECORD_TIMEOUT_S in all;
        the SIGTERM that follows then writes none of its own (the agent knows it was asked)."""
        outcomes: Dict[int, RecordOutcome] = {}
        reason = f"probing run --hang-timeout: no progress for {stalled:.0f} s"

        def ask(pid: int) -> None:
            try:
                with self._target(pid).connect(RECORD_TIMEOUT_S) as client:
                    result, _ = client.call(
                        "record", {"kind": "watchdog", "reason": reason}, timeout=RECORD_TIMEOUT_S
                    )
                path = result.get("path") if isinstance(result, dict) else None
                outcomes[pid] = RecordOutcome(pid, path if isinstance(path, str) else None, None)
            except NoAgent:
                return  # a shell, or a process started without the agent: nothing to record
            except ProbingError as error:
                outcomes[pid] = RecordOutcome(pid, None, error.message)

        threads = [threading.Thread(target=ask, args=(pid,), daemon=True) for pid in tree]
        deadline = time.monotonic() + RECORD_TIMEOUT_S + 1.0
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        late = RecordOutcome(0, None, f"no record within {RECORD_TIMEOUT_S:g} s")
        found = [
            outcomes.get(pid) or (late._replace(pid=pid) if thread.is_alive() else None)
            for pid, thread in zip(tree, threads)
        ]
        return tuple(outcome for outcome in found if outcome is not None)

    @staticmethod
    def _end(tree: List[int]) -> None:
        for pid in reversed(tree):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + TERMINATE_GRACE_S
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in tree[1:]):
            time.sleep(0.05)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
