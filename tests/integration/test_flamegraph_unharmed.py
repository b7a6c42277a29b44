"""Sampling a job that runs at full speed does not harm it: its steps take as long while the
agent samples as before, and it goes on afterwards."""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import List, Tuple

import pytest

from support import Target, probing, wait_until

# The job's median step while sampled against its own steps before and after: other tests'
# processes on the machine would move the steps of one window and not the other's.
pytestmark = pytest.mark.serial


def steps(job: Target) -> List[Tuple[float, float]]:
    """(start, seconds) of every step the job printed so far."""
    found = []
    for line in list(job.stdout_lines):
        parts = line.split()
        if len(parts) == 3 and parts[0] == "step":
            found.append((float(parts[1]), float(parts[2])))
    return found


def test_sampling_a_busy_job_leaves_its_step_time_alone(tmp_path: Path) -> None:
    with Target("timed_stepper.py", via="run", args=["--long-steps"]) as job:
        assert wait_until(lambda: len(steps(job)) >= 40, 30)
        started = time.monotonic()
        result = probing(str(job.pid), "flamegraph", "--duration", "3", "-o", str(tmp_path / "cpu.folded"))
        ended = time.monotonic()
        assert result.returncode == 0, result.stderr
        assert wait_until(lambda: steps(job)[-1][0] > ended + 1.5, 15)
        timed = steps(job)
        before = [took for at, took in timed if at < started]
        during = [took for at, took in timed if started + 0.5 < at and at + took < ended - 0.5]
        after = [took for at, took in timed if at > ended]
        assert during and after
        # A loose bound: on this shared 2-core machine the median step of the same job, sampled by
        # nobody, moved by up to 45% between 3-second windows, and in CI the whole machine once
        # slowed from before the window to after it (24 ms steps, then 39 ms sampled, 40 ms after).
        # So the window is held against the slower of its neighbours: a sampler that stalls the
        # job makes it slower than both. benchmarks/bench_flamegraph.py measures the real cost,
        # interleaved; the GIL share below is the precise figure.
        neighbour = max(statistics.median(before), statistics.median(after))
        assert statistics.median(during) < 1.5 * neighbour, (before, during, after)
        assert "work (timed_stepper.py:" in (tmp_path / "cpu.folded").read_text()
        # The precise figure: the agent's own count of the time it held the GIL, the answer's
        # building included, within the 0.5 % it promises.
        share = re.search(r"held the GIL ([0-9.]+)% of the time", result.stderr)
        assert share is not None and float(share.group(1)) <= 0.5, result.stderr
        assert job.alive()
