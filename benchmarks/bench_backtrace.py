"""`probing PID backtrace` on the paths of "a backtrace that always answers", each against
py-spy reading the same process in the same run (medians, interleaved).

    .venv/bin/python benchmarks/bench_backtrace.py [--runs 15]

1. a healthy process and a torch training job (the agent answers), and one whose GIL is held
   forever (the answer comes from outside), each vs `py-spy dump`: the `probing` command (the
   native front end, native/front/) and the Python CLI alone (PROBING_NATIVE_FRONT=0); for the
   torch job and the GIL-held one, where the time goes
2. `--children` on a job with a 4-worker DataLoader, vs `py-spy dump --subprocesses`
3. `--native` on a process with torch imported, vs `py-spy dump --native`
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
TARGETS = HERE.parent / "tests" / "targets"
BIN = Path(sys.executable).parent
PROBING, PY_SPY = str(BIN / "probing"), str(BIN / "py-spy")


def start(script: Path, agent: bool) -> tuple[subprocess.Popen[bytes], int]:
    env = {key: value for key, value in os.environ.items() if key != "PROBING"}
    command = [sys.executable, str(script)]
    if agent:
        command = [PROBING, "run", "--", *command]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert process.stdout is not None and process.stderr is not None
    if not process.stdout.readline().startswith(b"ready"):
        raise RuntimeError(f"{script} did not start")
    pid = process.pid
    if agent:
        pid = int(process.stderr.readline().decode().split("PID ")[1].split(":")[0])
    return process, pid


def stop(process: subprocess.Popen[bytes], pid: int) -> None:
    subprocess.run(["pkill", "-9", "-P", str(pid)], capture_output=True)  # DataLoader workers
    for victim in (pid, process.pid):
        try:
            os.kill(victim, 9)
        except ProcessLookupError:
            pass
    process.wait()


# The Python CLI alone, without the native front end (docs/decisions.md, issue 12).
PYTHON_CLI_ENV = dict(os.environ, PROBING_NATIVE_FRONT="0")


def medians(commands: Dict[str, List[str]], runs: int) -> Dict[str, float]:
    """Median milliseconds of each command, the commands run in turn (interleaved) `runs`
    times. A name that says "Python CLI" runs with PROBING_NATIVE_FRONT=0."""
    environments = {name: PYTHON_CLI_ENV if "Python CLI" in name else None for name in commands}
    for name, command in commands.items():
        subprocess.run(command, capture_output=True, env=environments[name])  # warm
    times: Dict[str, List[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            started = time.perf_counter()
            result = subprocess.run(command, capture_output=True, env=environments[name])
            times[name].append((time.perf_counter() - started) * 1000)
            if result.returncode != 0:
                raise RuntimeError(f"{command}: {result.stderr.decode()}")
    return {name: statistics.median(values) for name, values in times.items()}


# Run from a directory without a `probing` folder, so that `python -c "import probing..."` times
# the installed package, as the command uses it.
NEUTRAL_CWD = "/"
ROUND_TRIP = """
import statistics, sys, time
from probing.client.connection import Client
from probing.client.discovery import locate_socket
pid = int(sys.argv[1])
path, times = locate_socket(pid), []
for _ in range(int(sys.argv[2])):
    started = time.perf_counter()
    with Client(path, 5.0, pid=pid) as client:
        client.call("backtrace", {"locals": False, "thread": None})
    times.append((time.perf_counter() - started) * 1000)
    time.sleep(0.02)
print(statistics.median(times))
"""


def part_times(parts: Dict[str, List[str]], runs: int) -> Dict[str, float]:
    times: Dict[str, List[float]] = {name: [] for name in parts}
    for _ in range(runs):
        for name, command in parts.items():
            started = time.perf_counter()
            subprocess.run(command, capture_output=True, cwd=NEUTRAL_CWD, check=False)
            times[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def where_the_time_goes(pid: int, runs: int) -> None:
    """The command's parts, each measured on its own in the same run."""
    python = str(BIN / "python")
    parts = part_times({
        "start": [python, "-c", "pass"],
        "imports": [python, "-c", "import probing.cli.backtrace, probing.cli.fast"],
        "bare": ["/bin/true"],
    }, runs)  # fmt: skip
    start, imports, bare = parts["start"], parts["imports"], parts["bare"]
    trip = subprocess.run([python, "-c", ROUND_TRIP, str(pid), str(runs * 2)], capture_output=True,
                          text=True, cwd=NEUTRAL_CWD, check=True)  # fmt: skip
    print(f"   where the time goes, Python CLI: interpreter start {start:.1f} ms, probing's imports "
          f"{imports - start:.1f} ms, connect + hello + backtrace round trip "
          f"{float(trip.stdout):.1f} ms (median of {runs * 2}, one process); the rest renders")  # fmt: skip
    print(f"   where the time goes, native front end: starting a C program (/bin/true) {bare:.1f} ms, the "
          f"same round trip (the agent's side of it) {float(trip.stdout):.1f} ms; the rest reads /proc, "
          "the job's source files, and renders")  # fmt: skip


def where_the_stuck_time_goes(pid: int, runs: int) -> None:
    """The GIL-held path of the native front end: two looks at the threads, then py-spy."""
    python = str(BIN / "python")
    parts = part_times({
        "start": [python, "-c", "pass"],
        "py-spy": [PY_SPY, "dump", "--pid", str(pid), "--json"],
    }, runs)  # fmt: skip
    print(f"   where the time goes, native front end: the agent silent and no thread running in two looks "
          f"1 ms apart (~2 ms), then py-spy dump --json ({parts['py-spy']:.1f} ms alone), whose JSON it "
          f"renders; no interpreter starts (python -c pass alone: {parts['start']:.1f} ms). The Python CLI "
          "starts only when the dump is not one the front end renders, and then reads it from the pipe "
          "it is handed rather than running py-spy again")  # fmt: skip


def report(title: str, figures: Dict[str, float]) -> None:
    """Each figure, and each command's ratio to the last one (the baseline)."""
    names = list(figures)
    baseline = names[-1]
    print(f"\n{title}")
    for name in names:
        print(f"   {name:<58} {figures[name]:8.1f} ms")
    for name in names[:-1]:
        print(f"   ratio, {name} / {baseline}: {figures[name] / figures[baseline]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--first-only", action="store_true", help="only part 1 (the single process)")
    arguments = parser.parse_args()
    runs = arguments.runs
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}")
    for label, script in (("healthy process (agent answers)", TARGETS / "sleeper.py"),
                          ("torch training job (agent answers)", TARGETS / "torch_job.py"),
                          ("GIL held forever (answer from outside)", TARGETS / "gil_holder.py")):  # fmt: skip
        process, pid = start(script, agent=True)
        try:
            figures = medians({"probing backtrace (native front end)": [PROBING, str(pid), "backtrace"],
                               "probing backtrace, Python CLI (PROBING_NATIVE_FRONT=0)":
                                   [PROBING, str(pid), "backtrace"],
                               "py-spy dump": [PY_SPY, "dump", "--pid", str(pid)]}, runs)  # fmt: skip
            report(f"1. {label}, median of {runs} interleaved runs", figures)
            if script.name == "torch_job.py":
                where_the_time_goes(pid, runs)
            if script.name == "gil_holder.py":
                where_the_stuck_time_goes(pid, runs)
        finally:
            stop(process, pid)
    if arguments.first_only:
        return
    process, pid = start(HERE / "dataloader_target.py", agent=False)
    children = {
        "probing backtrace --children": [PROBING, str(pid), "backtrace", "--children"],
        "py-spy dump --subprocesses": [PY_SPY, "dump", "--pid", str(pid), "--subprocesses"],
    }
    try:
        figures = medians(children, runs)
    finally:
        stop(process, pid)
    report(f"2. --children, DataLoader with 4 workers, median of {runs}", figures)
    process, pid = start(HERE / "attach_target.py", agent=False)
    native = {
        "probing backtrace --native": [PROBING, str(pid), "backtrace", "--native"],
        "py-spy dump --native": [PY_SPY, "dump", "--pid", str(pid), "--native"],
    }
    try:
        figures = medians(native, runs)
    finally:
        stop(process, pid)
    report(f"3. --native, torch imported, median of {runs}", figures)


if __name__ == "__main__":
    main()
