"""`probing PID top`: one refresh of a live view, of a process (a line per thread) or of a job (a
line per rank).

A refresh costs the job what `backtrace` costs it: one look at its stacks, through its agent (or
from outside when the agent cannot answer). CPU and resident memory are read by the CLI from
/proc, which costs the job nothing. A job's progress in its collectives (its default group's
last collective enqueued and completed, python.process_groups) is read one refresh in
PROGRESS_EVERY, and on the second for a rate: a read costs a rank about a look at its stacks (a
gloo group's completed count lags, and the Flight Recorder's entries are read to correct it).
benchmarks/bench_top.py: a 4-rank job's step x1.011 under `top --ranks all`, x1.028 under
`backtrace --ranks all` once a second (one CLI that stays, against one started each second).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from .. import procfs
from ..analysis.glance import glance, job_frame, where
from ..errors import ProbingError, ProcessNotFound
from ..schema.tables import PROCESS_GROUPS
from .backtrace import read_stacks, stacks_deadline
from .jobs.fanout import gather
from .jobs.job import Job, Rank
from .sources import SourceLines
from .target import Fallback, Target

# Refreshes between reads of each rank's python.process_groups (the first refresh reads it).
PROGRESS_EVERY = 5
TABLE_PARAMS = {"scan_budget_s": 0.5, "step_wait_s": 0.0}
# The first refresh's CPU is measured from the moment the watch began, over this long at least:
# /proc counts CPU in ticks of 10 ms, so a shorter span would say 0% or 200%.
FIRST_SPAN_S = 0.25


class ThreadLine(NamedTuple):
    name: str
    native_id: Any
    is_main: bool
    cpu_percent: Optional[float]  # of one core, since the previous refresh; None on the first
    state: str
    where: str  # the innermost Python frame, and the job's own frame below it where that differs


class ProcessView(NamedTuple):
    pid: Optional[int]
    command: str
    cpu_percent: Optional[float]
    rss_bytes: Optional[int]
    source: str  # "agent" or "py-spy"
    threads: List[ThreadLine]  # busiest first
    notes: List[str]


class RankLine(NamedTuple):
    rank: int
    node: Optional[int]
    pid: int
    cpu_percent: Optional[float]  # None where /proc cannot be read (another node)
    rss_bytes: Optional[int]
    enqueued: Optional[int]  # its default group's last collective enqueued, as last read
    completed: Optional[int]
    rate: Optional[float]  # collectives enqueued a second, between its last two reads
    state: Optional[str]  # its main thread at a glance
    error: Optional[str]  # why it could not be looked at


class JobView(NamedTuple):
    job: Job
    ranks: List[RankLine]  # the rank furthest behind first
    exit_code: int


class CpuClock:
    """CPU use between refreshes, from /proc: each key's seconds and when they were read; primed
    when the watch begins, so that the first refresh has figures too."""

    def __init__(self) -> None:
        self._last: Dict[Any, Tuple[float, float]] = {}
        self._primed_at: Optional[float] = None

    def prime(self, readings: List[Tuple[Any, Optional[float]]]) -> None:
        now = time.monotonic()
        for key, seconds in readings:
            if seconds is not None:
                self._last[key] = (seconds, now)
        self._primed_at = now

    def settle(self) -> None:
        """Before the first figures after `prime`: what is left of FIRST_SPAN_S is waited out."""
        if self._primed_at is not None:
            time.sleep(max(0.0, self._primed_at + FIRST_SPAN_S - time.monotonic()))
            self._primed_at = None

    def percent(self, key: Any, seconds: Optional[float]) -> Optional[float]:
        if seconds is None:
            return None
        now = time.monotonic()
        last = self._last.get(key)
        self._last[key] = (seconds, now)
        if last is None or now <= last[1]:
            return None
        return max(0.0, 100.0 * (seconds - last[0]) / (now - last[1]))


def cpu_readings(pid: int) -> List[Tuple[Any, Optional[float]]]:
    """A process's CPU seconds and each of its threads' ((pid, native id)), as the refreshes key them."""
    readings: List[Tuple[Any, Optional[float]]] = [(pid, procfs.cpu_and_resident(pid)[0])]
    try:
        threads = [int(name) for name in os.listdir(f"/proc/{pid}/task") if name.isdigit()]
    except OSError:
        return readings
    return readings + [((pid, native), procfs.thread_cpu_seconds_of(pid, native)) for native in threads]


class ProcessWatch:
    """A process refreshed again and again."""

    def __init__(self, target: Target, timeout: float) -> None:
        self.target, self.timeout = target, timeout
        self.clock = CpuClock()
        if target.pid and not target.remote:
            self.clock.prime(cpu_readings(target.pid))

    def refresh(self) -> ProcessView:
        return process_view(self.target, self.timeout, self.clock)


def process_view(target: Target, timeout: float, clock: CpuClock) -> ProcessView:
    """One refresh of a process: a look at its stacks, and each thread's CPU since the last."""
    stacks = read_stacks(target, False, None, timeout)
    clock.settle()
    pid = stacks.pid
    seconds, resident = procfs.cpu_and_resident(pid) if pid and not target.remote else (None, None)
    lines = []
    for thread in stacks.threads:
        used = procfs.thread_cpu_seconds_of(pid, thread.native_id) if pid and not target.remote else None
        lines.append(
            ThreadLine(
                str(thread.name), thread.native_id, bool(thread.is_main),
                clock.percent((pid, thread.native_id), used), thread.state, _where(thread.frames),
            )
        )  # fmt: skip
    lines.sort(key=lambda line: (-(line.cpu_percent or 0.0), not line.is_main, line.name))
    argv = stacks.info.get("argv")
    command = " ".join(str(word) for word in argv) if isinstance(argv, list) else ""
    source = str(stacks.rows[0].get("source")) if stacks.rows else "agent"
    return ProcessView(pid, command, clock.percent(pid, seconds), resident, source, lines, stacks.notes)


def _where(frames: List[Any]) -> str:
    """A thread's innermost Python frame, `from` the job's own frame where that is another."""
    python = [frame for frame in frames if not frame.native]
    if not python:
        return "(no Python frame)"
    rows = [
        {"func": f.func, "file": f.file, "lineno": f.lineno, "frame_type": "Python"} for f in python[::-1]
    ]
    innermost, mine = rows[0], job_frame(rows)  # type: ignore[arg-type]
    text = where(innermost)  # type: ignore[arg-type]
    return text if mine is None or mine is innermost else f"{text} from {where(mine)}"


class JobWatch:
    """A job's ranks refreshed again and again: the progress each rank last showed, kept between
    the refreshes that read it."""

    def __init__(self, job: Job, chosen: List[Rank], target_of: Any, timeout: float, attach_timeout: float):
        self.job, self.chosen, self.target_of = job, chosen, target_of
        self.timeout, self.attach_timeout = timeout, attach_timeout
        self.clock = CpuClock()
        here = [rank for rank in chosen if _local(rank)]
        self.clock.prime([(rank.rank, procfs.cpu_and_resident(rank.pid)[0]) for rank in here])
        self.refreshes = 0
        self.progress: Dict[int, Tuple[Optional[int], Optional[int]]] = {}
        self.rates: Dict[int, float] = {}
        self._read_at: Dict[int, Tuple[float, int]] = {}  # when each rank's count was last read

    def refresh(self) -> JobView:
        # The second refresh reads it too: a rate needs two reads.
        with_progress = self.refreshes % PROGRESS_EVERY == 0 or self.refreshes == 1
        self.refreshes += 1

        def look(rank: Rank) -> Tuple[str, Optional[Tuple[Optional[int], Optional[int]]]]:
            target = self.target_of(rank)
            stacks = read_stacks(target, False, None, self.timeout)
            state = glance(stacks.rows, SourceLines(stacks.pid).frame_line, stacks.info.get("outside"))
            if not with_progress:
                return state, None
            try:
                return state, _progress(target, self.timeout)
            except (ProbingError, Fallback):  # stacks read from outside: no agent to ask, this time
                return state, None

        deadline = stacks_deadline(self.timeout, self.attach_timeout) + (self.timeout + 2.0) * with_progress
        gathered = gather(self.chosen, look, deadline + 1.0)
        looked = {rank.rank: answer for rank, answer in gathered.answers}
        failed = {missing.rank.rank: missing.error for missing in gathered.missing}
        self.clock.settle()
        lines = []
        for rank in self.chosen:
            state, progress = looked.get(rank.rank, (None, None))
            if progress is not None:
                self._keep(rank.rank, progress)
            lines.append(self._line(rank, state, failed.get(rank.rank)))
        lines.sort(key=_behind_first)
        here = [rank for rank in self.chosen if not rank.remote and rank.pid > 0]
        if not gathered.answers and here and not any(procfs.process_alive(rank.pid) for rank in here):
            hint = "`probing records` lists what they left"
            raise ProcessNotFound("every rank of the job has ended", hint=hint)
        return JobView(self.job, lines, gathered.exit_code())

    def _keep(self, rank: int, progress: Tuple[Optional[int], Optional[int]]) -> None:
        self.progress[rank] = progress
        enqueued, now = progress[0], time.monotonic()
        if enqueued is None:
            return
        last = self._read_at.get(rank)
        if last is not None and now > last[0]:
            self.rates[rank] = max(0.0, (enqueued - last[1]) / (now - last[0]))
        self._read_at[rank] = (now, enqueued)

    def _line(self, rank: Rank, state: Optional[str], error: Optional[ProbingError]) -> RankLine:
        seconds, resident = procfs.cpu_and_resident(rank.pid) if _local(rank) else (None, None)
        enqueued, completed = self.progress.get(rank.rank, (None, None))
        return RankLine(
            rank.rank, rank.node, rank.pid, self.clock.percent(rank.rank, seconds), resident,
            enqueued, completed, self.rates.get(rank.rank), state,
            error.message if error is not None else None,
        )  # fmt: skip


def _local(rank: Rank) -> bool:
    """A rank whose CPU and memory this machine's /proc has."""
    return not rank.remote and rank.pid > 0 and os.path.isdir(f"/proc/{rank.pid}")


def _progress(target: Target, timeout: float) -> Tuple[Optional[int], Optional[int]]:
    """The default group's (else the first group's) last collective enqueued and completed."""
    with target.connect(timeout) as client:
        rows = list(client.fetch_table(PROCESS_GROUPS.name, TABLE_PARAMS, timeout + 2.0).to_rows())
    rows.sort(key=lambda row: (row.get("pg_desc") != "default_pg", str(row.get("pg_id"))))
    if not rows:
        return None, None
    enqueued, completed = rows[0].get("last_enqueued"), rows[0].get("last_completed")
    return (
        enqueued if isinstance(enqueued, int) else None,
        completed if isinstance(completed, int) else None,
    )


def _behind_first(line: RankLine) -> Tuple[int, float, int]:
    """Ranks that could not be looked at first, then the fewest collectives enqueued (the rank
    the others wait for), then by rank."""
    behind = float(line.enqueued) if line.enqueued is not None else float("inf")
    return (0 if line.error else 1, behind, line.rank)
