"""What memory sampling and `probing PID memory` cost, each against a baseline in the same run.

    .venv/bin/python benchmarks/bench_memory.py [--seconds 120] [--objects 1000000] [--runs 7]

1. The process.memory sampler at its default interval (1 s): the CPU its thread used (measured
   by the thread itself, and the whole process's CPU with sampling on against the same job with
   sampling off), on a small idle job and on a torch job holding --objects live objects (where
   counting gc objects is the expensive part).
2. `probing PID memory` on the torch job with --objects live objects: wall time (median) against
   `probing PID eval 1` (the round trip every command pays), how long the object census took, and
   the longest a heartbeat thread in the job was held still meanwhile against a quiet window.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
PROBING = str(BIN / "probing")
TARGET = str(HERE / "memory_target.py")
SLEEPER = str(HERE.parent / "tests" / "targets" / "sleeper.py")
TICKS = os.sysconf("SC_CLK_TCK")


class Job:
    def __init__(self, args: List[str], interval: str) -> None:
        env = {key: value for key, value in os.environ.items() if key != "PROBING"}
        env["PROBING_MEMORY_INTERVAL"] = interval
        self.process = subprocess.Popen(
            [PROBING, "run", "--", sys.executable, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip
        assert self.process.stdout is not None and self.process.stderr is not None
        ready = self.process.stdout.readline().decode()
        if not ready.startswith("ready"):
            raise RuntimeError(f"{args} did not start: {ready!r} {self.process.stderr.read().decode()}")
        self.pid = int(self.process.stderr.readline().decode().split("PID ")[1].split(":")[0])

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def probing(self, *args: str) -> str:
        result = subprocess.run([PROBING, str(self.pid), *args], capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(result.stderr)
        return result.stdout

    def sampler(self) -> Dict[str, Any]:
        # Read through eval: `memory` would walk every object, and that is not the sampler's cost.
        sampler = "sys.modules['probing.agent.memory.sampler']"
        code = f"import json, sys; print(json.dumps({sampler}.current().status()))"
        status: Dict[str, Any] = json.loads(self.probing("eval", code))
        return status

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def sampler_cost(name: str, args: List[str], seconds: float) -> None:
    sampling, quiet = Job(args, "1"), Job(args, "0")
    try:
        time.sleep(3)  # past start-up
        cpu = {job: job.cpu_seconds() for job in (sampling, quiet)}
        thread_cpu = sampling.sampler()["cpu_s"]
        started = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - started
        used = {job: job.cpu_seconds() - cpu[job] for job in (sampling, quiet)}
        status = sampling.sampler()
        thread_share = (status["cpu_s"] - thread_cpu) / elapsed
        print(f"{name}: over {elapsed:.0f} s at the default 1 s interval, {status['samples']} samples")
        every = status["gc_count_every"]
        counted = f"every {every} samples" if every else "never: one count took over 200 ms"
        last = 1000 * status["gc_count_s"]
        print(f"  sampler thread CPU (its own clock):     {100 * thread_share:.4f}% of a core "
              f"(gc objects counted {counted}; the last count took {last:.0f} ms)")  # fmt: skip
        print(f"  process CPU, sampling on (ticks):       {100 * used[sampling] / elapsed:.3f}% of a core")
        print(f"  process CPU, sampling off (baseline):   {100 * used[quiet] / elapsed:.3f}% of a core")
    finally:
        sampling.stop()
        quiet.stop()


def memory_wall_time(objects: int, runs: int) -> None:
    job = Job([TARGET, str(objects), "heartbeat"], "1")
    try:
        job.probing("eval", "1")
        walls: List[float] = []
        rounds: List[float] = []
        census: List[float] = []
        gaps: List[float] = []
        quiet: List[float] = []
        for _ in range(runs):
            job.probing("eval", "reset()")
            started = time.perf_counter()
            job.probing("eval", "1")
            rounds.append(time.perf_counter() - started)
            time.sleep(1.0)
            quiet.append(float(job.probing("eval", "longest_gap()")))
            job.probing("eval", "reset()")
            started = time.perf_counter()
            summary = json.loads(job.probing("memory", "--format", "json"))
            walls.append(time.perf_counter() - started)
            gaps.append(float(job.probing("eval", "longest_gap()")))
            census.append(summary["gc"]["elapsed_s"])
            counted, total = summary["gc"]["counted"], summary["gc"]["objects"]
        wall, base = statistics.median(walls), statistics.median(rounds)
        print(f"memory on a torch job holding {objects:,} objects ({total:,} tracked by gc; "
              f"{counted:,} counted), median of {runs}:")  # fmt: skip
        print(f"  probing PID memory:     {wall * 1000:7.0f} ms  (x{wall / base:.1f} the eval round trip)")
        print(f"  probing PID eval 1:     {base * 1000:7.0f} ms  (baseline)")
        print(f"  object census inside:   {statistics.median(census) * 1000:7.0f} ms")
        print(f"  longest heartbeat gap:  {statistics.median(gaps) * 1000:7.1f} ms during memory, "
              f"{statistics.median(quiet) * 1000:.1f} ms in a quiet second")  # fmt: skip
    finally:
        job.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=7)
    arguments = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    memory_wall_time(arguments.objects, arguments.runs)
    sampler_cost("small idle job", [SLEEPER], arguments.seconds)
    sampler_cost(
        f"torch job holding {arguments.objects:,} objects",
        [TARGET, str(arguments.objects)],
        arguments.seconds,
    )


if __name__ == "__main__":
    main()
