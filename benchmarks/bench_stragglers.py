"""What `stragglers` costs the job it watches, and how soon its verdict comes.

A 4-rank DDP job under torchrun (gloo, CPU: tests/targets/straggler_job.py) whose rank 1 reads
each batch 20 ms late. Rank 0 logs every step's end time and length. Windows of the same length
alternate, unwatched and watched (`probing PID stragglers --duration W` running), round by
round, so drift on a shared machine hits both alike. Reported: the median step in each kind of
window and their ratio (the goal: unchanged beyond noise), and the command's wall time against
its --duration (the goal: the verdict within --duration + 3 s), with the verdict it gave.

    .venv/bin/python benchmarks/bench_stragglers.py [--rounds 3] [--window 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
JOB = os.path.join(ROOT, "tests", "targets", "straggler_job.py")


SLOW_RANK_1 = ("--slow-data", "1:20")


def start_job(step_log: str, slowness: Tuple[str, ...] = SLOW_RANK_1) -> Tuple[subprocess.Popen, int]:  # type: ignore[type-arg]
    """The 4-rank job, rank 1 made slow by `slowness` (straggler_job.py's options); rank 0's PID."""
    environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    job = subprocess.Popen(
        [os.path.join(BIN, "torchrun"), "--standalone", "--nproc-per-node=4", JOB, *slowness,
         "--step-log", step_log],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environment, start_new_session=True,
    )  # fmt: skip
    ready = {}
    deadline = time.monotonic() + 180
    assert job.stdout is not None
    while len(ready) < 4 and time.monotonic() < deadline:
        words = job.stdout.readline().split()
        if len(words) == 3 and words[0] == "ready":
            ready[int(words[1])] = int(words[2])
    if len(ready) < 4:
        raise SystemExit("the job never got ready")
    return job, ready[0]


def steps_between(step_log: str, start: float, end: float) -> List[float]:
    steps = []
    with open(step_log) as lines:
        for line in lines:
            at, seconds = (float(word) for word in line.split())
            if start <= at <= end:
                steps.append(seconds)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=8.0)
    options = parser.parse_args()
    probing = os.path.join(BIN, "probing")
    with tempfile.TemporaryDirectory() as folder:
        step_log = os.path.join(folder, "steps")
        job, rank0 = start_job(step_log)
        try:
            subprocess.run(
                [probing, str(rank0), "backtrace", "--ranks", "all"], capture_output=True, check=True
            )
            unwatched: List[float] = []
            watched: List[float] = []
            walls, verdicts = [], []
            for _ in range(options.rounds):
                start = time.time()
                time.sleep(options.window)
                unwatched += steps_between(step_log, start, time.time())
                start = time.time()
                began = time.monotonic()
                command = [
                    probing,
                    str(rank0),
                    "stragglers",
                    "--duration",
                    str(options.window),
                    "--format",
                    "json",
                ]
                answer = subprocess.run(command, capture_output=True, text=True)
                walls.append(time.monotonic() - began)
                watched += steps_between(step_log, start, start + options.window)
                verdicts.append(json.loads(answer.stdout)["summary"] if answer.stdout else answer.stderr)
        finally:
            os.killpg(job.pid, 9)
            job.wait()
    quiet, looked = statistics.median(unwatched), statistics.median(watched)
    rounds = f"{options.rounds} rounds of {options.window:.0f} s windows"
    print(f"4 ranks (gloo, CPU, DDP), rank 1 reads 20 ms late; {rounds}")
    print(f"  median step unwatched {quiet * 1e3:.1f} ms ({len(unwatched)} steps), "
          f"watched {looked * 1e3:.1f} ms ({len(watched)} steps): ratio {looked / quiet:.3f}")  # fmt: skip
    beyond = f"{min(walls) - options.window:.2f}-{max(walls) - options.window:.2f} s"
    wall = f"{min(walls):.2f}-{max(walls):.2f} s"
    print(f"  stragglers --duration {options.window:.0f}: wall {wall}, beyond the window {beyond}")
    for verdict in verdicts:
        print(f"  verdict: {verdict}")


if __name__ == "__main__":
    main()
