"""What four clients querying python.modules in a loop cost a training job's steps.

The job (benchmarks/torch_target.py: 100 small blocks, an optimizer, every step's duration in a
log) runs with the agent. Three modes take turns in blocks of equal length, so that drift on a
shared machine hits each alike:

- idle:     nobody queries;
- control:  four clients run `probing PID query` over process.stats, which the CLI reads itself
            with psutil, never asking the agent: the same CLI processes on the same two cores;
- modules:  four clients run `probing PID query "SELECT name, grad_norm FROM python.modules"`,
            whose gradient norms are read in the training thread at each step boundary.

Reported: median and 99th-percentile step time per mode, the ratios of modules to idle and to
control (the part the agent itself adds, CPU contention of the clients aside), the longest
step, and how many queries ran and how long they took.

    .venv/bin/python benchmarks/bench_unharmed.py [--rounds 4] [--block 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PROBING = os.path.join(os.path.dirname(sys.executable), "probing")
QUERIES = {
    "control": "SELECT count(*) FROM process.stats",
    "modules": "SELECT name, grad_norm FROM python.modules",
}


def read_steps(log: str, start: float, end: float) -> List[float]:
    steps = []
    with open(log) as lines:
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and start <= float(parts[0]) <= end:
                steps.append(float(parts[1]))
    return steps


def run_clients(pid: int, sql: str, seconds: float, clients: int) -> List[Tuple[float, int]]:
    """(seconds, exit code) of every query the clients ran in the window."""
    deadline = time.monotonic() + seconds
    results: List[Tuple[float, int]] = []

    def client() -> None:
        while time.monotonic() < deadline:
            started = time.monotonic()
            done = subprocess.run([PROBING, str(pid), "query", sql], capture_output=True, timeout=60)
            results.append((time.monotonic() - started, done.returncode))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--block", type=float, default=6.0, help="seconds per mode per round")
    parser.add_argument("--clients", type=int, default=4)
    options = parser.parse_args()
    steps: Dict[str, List[float]] = {"idle": [], "control": [], "modules": []}
    queries: Dict[str, List[Tuple[float, int]]] = {"control": [], "modules": []}
    with tempfile.TemporaryDirectory() as scratch:
        log = os.path.join(scratch, "steps.log")
        job = subprocess.Popen(
            [PROBING, "run", "--", sys.executable, os.path.join(HERE, "torch_target.py"), log],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert job.stdout is not None and job.stderr is not None
            pid = int(job.stderr.readline().split("PID")[1].split()[0].rstrip(":"))
            assert job.stdout.readline().strip() == "ready"
            time.sleep(2)  # warm-up steps are not measured
            for _ in range(options.rounds):
                for mode in steps:
                    start = time.time()
                    if mode == "idle":
                        time.sleep(options.block)
                    else:
                        queries[mode] += run_clients(pid, QUERIES[mode], options.block, options.clients)
                    time.sleep(0.2)  # the log is written by the job's own buffered file
                    steps[mode] += read_steps(log, start + 0.5, time.time() - 0.2)
            alive = job.poll() is None
        finally:
            job.kill()
            job.wait(10)
    print(f"torch_target.py (100 blocks, SGD), {options.rounds} rounds x {options.block:g} s per mode, "
          f"{options.clients} clients; CPU {os.cpu_count()} cores")  # fmt: skip
    idle = statistics.median(steps["idle"])
    for mode, durations in steps.items():
        durations.sort()
        p99 = durations[int(0.99 * (len(durations) - 1))]
        median = statistics.median(durations)
        print(
            f"  {mode:<8} steps {len(durations):>6}  median {median * 1e3:7.3f} ms "
            f"(x{median / idle:.2f} idle)  p99 {p99 * 1e3:7.2f} ms  longest {durations[-1] * 1e3:7.1f} ms"
        )
    control, modules = statistics.median(steps["control"]), statistics.median(steps["modules"])
    print(f"  modules / control: x{modules / control:.3f}   (what the agent adds beyond the clients' CPU)")
    for mode, runs in queries.items():
        failed = sum(1 for _, code in runs if code != 0)
        print(
            f"  {mode} queries: {len(runs)} run, {failed} failed, "
            f"median {statistics.median(s for s, _ in runs) * 1e3:.0f} ms each"
        )
    print(f"  job alive afterwards: {alive}")
    return 0 if alive and not any(code for runs in queries.values() for _, code in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
