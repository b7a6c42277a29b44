"""The whole job at once, measured on real torchrun jobs (gloo, CPU), each figure against a
baseline taken in the same run (medians, interleaved):

    .venv/bin/python benchmarks/bench_ranks.py [--ranks 8] [--runs 10]

1. `probing PID backtrace --ranks all` on an N-rank job whose ranks all have agents, against
   one rank's `probing PID backtrace`, and against N sequential `py-spy dump` calls (what a
   user does by hand without --ranks)
2. `probing PID hang --ranks all` on a 4-rank job where rank 2 stalls before an all_reduce: its
   wall time against its --duration (what it costs beyond the watching itself)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from support import PROBING, TorchrunJob  # noqa: E402

PY_SPY = str(Path(sys.executable).parent / "py-spy")


def timed(commands: Dict[str, List[List[str]]], runs: int) -> Dict[str, float]:
    """Median wall time in ms of each entry, an entry being commands run one after the other."""
    times: Dict[str, List[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, sequence in commands.items():
            started = time.perf_counter()
            for command in sequence:
                result = subprocess.run(command, capture_output=True)
                if result.returncode != 0:
                    raise RuntimeError(f"{command}: {result.stderr.decode()}")
            times[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def backtrace_all(ranks: int, runs: int) -> None:
    with TorchrunJob("idle", ranks=ranks, ready_timeout=300) as job:
        first = subprocess.run(
            [PROBING, str(job.agent_pid), "backtrace", "--ranks", "all"], capture_output=True
        )
        if first.returncode != 0:  # attaches to every rank
            raise RuntimeError(first.stderr.decode())
        one = job.pids[0]
        figures = timed(
            {
                "backtrace --ranks all": [[PROBING, str(one), "backtrace", "--ranks", "all"]],
                "one rank's backtrace": [[PROBING, str(one), "backtrace"]],
                f"{ranks} x py-spy dump": [[PY_SPY, "dump", "--pid", str(pid)] for pid in job.pids.values()],
            },
            runs,
        )
    names = list(figures)
    print(f"\n1. backtrace --ranks all on a {ranks}-rank job (agents in every rank), median of {runs}")
    for name in names:
        print(f"   {name:<28} {figures[name]:8.1f} ms")
    print(f"   ratio to one rank's backtrace: {figures[names[0]] / figures[names[1]]:.2f}x (aim <= 1.5x)")
    print(f"   ratio to {ranks} sequential py-spy dumps: {figures[names[0]] / figures[names[2]]:.2f}x")


def hang_all(runs: int, duration: float) -> None:
    walls = []
    with TorchrunJob("stall", ranks=4) as job:
        for _ in range(runs):
            started = time.perf_counter()
            result = subprocess.run(
                [PROBING, str(job.agent_pid), "hang", "--ranks", "all", "--duration", str(duration)],
                capture_output=True,
            )
            walls.append(time.perf_counter() - started)
            if result.returncode != 11:
                raise RuntimeError(f"hang --ranks all exited {result.returncode}: {result.stderr.decode()}")
    wall = statistics.median(walls)
    print(f"\n2. hang --ranks all on the 4-rank stalled job, --duration {duration:g}, median of {runs}")
    beyond = wall - duration
    print(f"   wall time {wall:.2f} s, {beyond:.2f} s beyond the watching ({wall / duration:.2f}x duration)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hang-runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=2.0)
    options = parser.parse_args()
    backtrace_all(options.ranks, options.runs)
    hang_all(options.hang_runs, options.duration)


if __name__ == "__main__":
    main()
