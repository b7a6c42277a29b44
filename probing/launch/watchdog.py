"""`probing run --hang-timeout S`: end a CI job that stopped progressing, with every stack.

Progress is analysis.progress's definition, the one `probing PID hang` uses: the job's main
thread (of the job, or of its first Python descendant when the job is a shell script) moved or
used the CPU. The watchdog samples the stacks through the engine (the agent, or py-spy when it
cannot answer); after S seconds without progress it reads every stack of the process tree,
hands them to its caller (`on_hung`: cli/run.py prints them and writes the JSON report), then
terminates the tree (SIGTERM, then SIGKILL after 5 s) and makes `probing run` exit 11.

It never prints.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable, List, NamedTuple, Optional, Tuple

from ..analysis.progress import ProgressTracker, take_sample
from ..engine.backtrace import Stacks, read_stacks
from ..engine.processes import descendants, first_python
from ..engine.sources import SourceLines
from ..engine.target import Target
from ..errors import ExitCode, ProbingError

# Seconds each look at the stacks may wait for the agent before reading from outside.
SAMPLE_TIMEOUT_S = 2.0
# After SIGTERM, how long the tree has to exit before SIGKILL.
TERMINATE_GRACE_S = 5.0


class HungJob(NamedTuple):
    """What the watchdog saw when it gave up on the job."""

    stalled_s: float
    # Per process of the tree: (pid, its stacks with the innermost frames' locals, or the
    # error that kept them from being read).
    processes: List[Tuple[int, Optional[Stacks], Optional[ProbingError]]]


class Watchdog:
    def __init__(
        self,
        pid: int,
        timeout: float,
        on_hung: Callable[[HungJob], None],
        log: Optional[Callable[[str], None]] = None,
    ) -> None:
        self.pid = pid
        self.timeout = timeout
        self.on_hung = on_hung
        self.log = log
        self.interval = min(max(timeout / 10, 0.2), 5.0)
        self.tracker: Optional[ProgressTracker] = None

    def _stacks(self, pid: int, with_locals: bool = False) -> Stacks:
        # The job was started with the agent in it: never attach (a process without one is
        # read from outside).
        target = Target(str(pid), self.log, no_attach=True)
        return read_stacks(target, with_locals, None, SAMPLE_TIMEOUT_S)

    def tick(self) -> Optional[int]:
        """Take one sample; ExitCode.HUNG once the job has been stalled for the timeout (the
        tree is ended by then), None while it progresses."""
        pid = first_python(self.pid)
        try:
            stacks = self._stacks(pid)
        except ProbingError:
            return None  # not started yet, or between processes: no verdict
        if self.tracker is None or self.tracker.pid != pid:
            # Source lines tell a wait line (time.sleep in a polling loop) from work, as in `hang`.
            sources = SourceLines(pid)
            self.tracker = ProgressTracker(pid, lambda frame: sources.line(frame["file"], frame["lineno"]))
        report = self.tracker.add(take_sample(pid, stacks.rows, stacks.info))
        stalled = self.tracker.stalled_s(time.monotonic())
        if not report.hung or stalled < self.timeout:
            return None
        tree = [self.pid] + [child for child, _ in descendants(self.pid)]
        self.on_hung(HungJob(stalled, [self._last_look(each) for each in tree]))
        self._end(tree)
        return ExitCode.HUNG

    def _last_look(self, pid: int) -> Tuple[int, Optional[Stacks], Optional[ProbingError]]:
        try:
            stacks = self._stacks(pid, with_locals=True)
        except ProbingError as error:
            return pid, None, error
        # Locals of the innermost frame of each thread only: what it is stuck on.
        stacks.rows = [dict(row, locals=row["locals"] if row["depth"] == 0 else None) for row in stacks.rows]
        return pid, stacks, None

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
