"""What attaching costs a running torch job, per method, against the same job left alone.

    .venv/bin/python benchmarks/bench_attach.py [--runs 5]

1. the longest time any thread of the job (a heartbeat thread, the training loop) was held
   still while `probing PID inject --method M` ran, for ptrace, gdb and pyrasite, next to
   the same window without an attach
2. wall time of the first `probing PID backtrace` on a fresh process, attach included
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
from typing import Dict, List

HERE = Path(__file__).resolve().parent
PROBING = str(Path(sys.executable).parent / "probing")
SLEEPER = str(HERE.parent / "tests" / "targets" / "sleeper.py")


class Job:
    def __init__(self, script: str) -> None:
        env = {key: value for key, value in os.environ.items() if key != "PROBING"}
        self.process = subprocess.Popen(
            [sys.executable, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )
        assert self.process.stdout is not None
        if not self.process.stdout.readline().startswith("ready"):
            raise RuntimeError(f"{script} did not start")
        self.pid = self.process.pid

    def command(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def report(self) -> Dict[str, float]:
        self.command("report")
        assert self.process.stdout is not None
        stats: Dict[str, float] = json.loads(self.process.stdout.readline())
        return stats

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def attach_cost(method: str) -> Dict[str, float]:
    job = Job(str(HERE / "attach_target.py"))
    try:
        time.sleep(1.0)  # the loop settles
        job.command("reset")
        time.sleep(0.3)
        started = time.perf_counter()
        result = subprocess.run(
            [
                PROBING,
                str(job.pid),
                "--attach-timeout",
                "30",
                "inject",
                "--method",
                method,
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{method}: {result.stderr}")
        window = time.perf_counter() - started + 0.3
        time.sleep(0.3)
        attached = job.report()
        time.sleep(window)
        baseline = job.report()
        report = json.loads(result.stdout)
    finally:
        job.stop()
    return {
        "gap_ms": attached["gap_ms"],
        "step_ms": attached["step_ms"],
        "base_gap_ms": baseline["gap_ms"],
        "base_step_ms": baseline["step_ms"],
        "reported_ms": report["stopped_ms"],
    }


def first_backtrace_ms(script: str) -> float:
    job = Job(script)
    try:
        started = time.perf_counter()
        result = subprocess.run([PROBING, str(job.pid), "backtrace"], capture_output=True, text=True)
        elapsed = (time.perf_counter() - started) * 1000
        if result.returncode != 0:
            raise RuntimeError(result.stderr)
        return elapsed
    finally:
        job.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--methods", default="ptrace,gdb,pyrasite")
    options = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}")
    print(
        f"\n1. threads held still by an attach (torch job: heartbeat, training loop), worst of {options.runs}"
    )
    columns = ("heartbeat gap", "step-to-step", "same job, no attach", "injector says")
    print(f"   {'method':<9} {columns[0]:>14} {columns[1]:>14} {columns[2]:>22} {columns[3]:>14}")
    for method in options.methods.split(","):
        runs: List[Dict[str, float]] = [attach_cost(method) for _ in range(options.runs)]
        worst = {key: max(run[key] for run in runs) for key in runs[0]}
        print(
            f"   {method:<9} {worst['gap_ms']:11.1f} ms {worst['step_ms']:11.1f} ms "
            f"{worst['base_gap_ms']:8.1f} / {worst['base_step_ms']:5.1f} ms {worst['reported_ms']:11.2f} ms"
        )
    print(f"\n2. first `probing PID backtrace` on a fresh process, attach included, {options.runs} runs")
    for name, script in (("sleeper.py", SLEEPER), ("torch job", str(HERE / "attach_target.py"))):
        times = [first_backtrace_ms(script) for _ in range(options.runs)]
        print(f"   {name:<11} median {statistics.median(times):6.0f} ms, max {max(times):6.0f} ms")


if __name__ == "__main__":
    main()
