"""What `probing PID report` costs on the torch demo job, against the commands it is made of,
measured in the same run.

    .venv/bin/python benchmarks/bench_report.py [--runs 5] [--trace-seconds 5]

The demo job (docs/examples/train.py) runs with the agent and with `trace on --backward`; after
--trace-seconds of traced steps, each command is run --runs times and its wall time (median)
printed: `report` with its default 2 s hang check and with none (--hang-duration 0), against
`backtrace`, `memory` and `hang --duration 2 --samples 5` (the same check alone). The report's
own account of where its time went (the footer's timings) and the page's size are printed too.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
PROBING = str(BIN / "probing")
DEMO = str(HERE.parent / "docs" / "examples" / "train.py")


def start_demo() -> Tuple[subprocess.Popen[bytes], int]:
    env = {key: value for key, value in os.environ.items() if key != "PROBING"}
    process = subprocess.Popen(
        [PROBING, "run", "--", sys.executable, DEMO],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    started = process.stderr.readline().decode()
    found = re.search(r"started PID (\d+)", started)
    if found is None:
        raise RuntimeError(f"the demo did not start: {started!r}")
    ready = process.stdout.readline().decode()
    if not ready.startswith("ready"):
        raise RuntimeError(f"the demo never said ready: {ready!r}")
    return process, int(found.group(1))


def timed(args: List[str]) -> float:
    started = time.monotonic()
    result = subprocess.run([PROBING, *args], capture_output=True, text=True)
    took = time.monotonic() - started
    if result.returncode not in (0, 11):  # hang exits 11 when it finds the job stuck
        raise RuntimeError(f"probing {' '.join(args)}: {result.stderr}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--trace-seconds", type=float, default=5.0)
    options = parser.parse_args()
    process, pid = start_demo()
    try:
        timed([str(pid), "trace", "on", "--backward"])
        time.sleep(options.trace_seconds)  # traced steps to draw: a benchmark, not a test
        with tempfile.TemporaryDirectory() as directory:
            page = os.path.join(directory, "job.html")
            commands: Dict[str, List[str]] = {
                "backtrace": [str(pid), "backtrace"],
                "memory": [str(pid), "memory"],
                "hang --duration 2 --samples 5": [str(pid), "hang", "--duration", "2", "--samples", "5"],
                "report --hang-duration 0": [str(pid), "report", "-o", page, "--hang-duration", "0"],
                "report (2 s hang check)": [str(pid), "report", "-o", page],
            }
            times = {name: [timed(args) for _ in range(options.runs)] for name, args in commands.items()}
            size = os.path.getsize(page)
            with open(page, encoding="utf-8") as handle:
                footer = re.search(r"time taken: ([^<]*)<", handle.read())
    finally:
        process.terminate()
        process.wait(10)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"probing report on the torch demo job (docs/examples/train.py, traced), median of {options.runs}:")
    for name, median in medians.items():
        print(f"  {name:<32} {median * 1000:7.0f} ms")
    bare = medians["report --hang-duration 0"]
    parts = medians["backtrace"] + medians["memory"]
    print(f"  report without the hang check / (backtrace + memory): {bare / parts:.2f}x")
    full = medians["report (2 s hang check)"]
    alone = parts + medians["hang --duration 2 --samples 5"]
    print(f"  report / (backtrace + memory + hang): {full / alone:.2f}x")
    timings = footer.group(1) if footer else "?"
    print(f"  page: {size / 1000:.0f} kB; the report's own timings, last run: {timings}")


if __name__ == "__main__":
    main()
