"""What `top --ranks all` costs the job it shows, against `backtrace --ranks all` once a second.

The issue's bar: `top` may cost the job no more than `backtrace` once a second does. A 4-rank DDP
job under torchrun (gloo, CPU: tests/targets/straggler_job.py, every rank alike); rank 0 logs
every step's end and length. Windows of the same length follow each other round by round, so
drift on a shared machine hits each kind alike: nothing watching; `probing PID backtrace --ranks
all` started once a second; `probing PID top --ranks all` (refreshing every second, to a pipe).
Reported: the median step in each kind of window, each against the unwatched one, and top's
against backtrace's.

    .venv/bin/python benchmarks/bench_top.py [--rounds 3] [--window 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

from bench_stragglers import BIN, start_job, steps_between

KINDS = ("unwatched", "backtrace once a second", "top")


def watch(kind: str, probing: str, rank0: int, window: float) -> None:
    """`kind` of window, for `window` seconds."""
    end = time.monotonic() + window
    if kind == "top":
        command = [probing, str(rank0), "top", "--ranks", "all", "--interval", "1"]
        shown = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(window)
        shown.kill()
        shown.wait()
        return
    while time.monotonic() < end:
        started = time.monotonic()
        if kind != "unwatched":
            subprocess.run([probing, str(rank0), "backtrace", "--ranks", "all"], capture_output=True)
        time.sleep(max(0.0, min(end, started + 1.0) - time.monotonic()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=10.0)
    options = parser.parse_args()
    probing = os.path.join(BIN, "probing")
    steps: Dict[str, List[float]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as folder:
        step_log = os.path.join(folder, "steps")
        job, rank0 = start_job(step_log, ())
        try:
            # The agents go in first: an attach is not what a refresh costs.
            first = [probing, str(rank0), "backtrace", "--ranks", "all"]
            subprocess.run(first, capture_output=True, check=True)
            for _ in range(options.rounds):
                for kind in KINDS:
                    start = time.time()
                    watch(kind, probing, rank0, options.window)
                    steps[kind] += steps_between(step_log, start + 0.5, time.time())
        finally:
            os.killpg(job.pid, 9)
            job.wait()
    medians = {kind: statistics.median(values) for kind, values in steps.items()}
    quiet = medians["unwatched"]
    print(f"4 ranks (gloo, CPU, DDP), {options.rounds} rounds of {options.window:.0f} s windows")
    for kind in KINDS:
        print(f"  {kind:24} median step {medians[kind] * 1e3:6.2f} ms ({len(steps[kind])} steps), "
              f"x{medians[kind] / quiet:.3f} of unwatched")  # fmt: skip
    top_cost = medians["top"] - quiet
    backtrace_cost = medians["backtrace once a second"] - quiet
    against = medians["top"] / medians["backtrace once a second"]
    print(f"  top against backtrace once a second: step x{against:.3f}; "
          f"added {top_cost * 1e3:+.2f} ms a step against {backtrace_cost * 1e3:+.2f} ms")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
