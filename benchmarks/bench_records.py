"""Records (issue 15): what writing one costs the dying job, and what the hooks cost a job that
never dies.

    .venv/bin/python benchmarks/bench_records.py [--rows 1000000] [--runs 3] [--idle 10]

1. A job with torch imported whose python.torch_trace ring holds --rows rows. The ring is
   filled synthetically (rows appended straight into the tracer's ring, shaped like a 12-module
   model's: a real 1 M-row trace takes hours of steps), then the job calls its own
   sys.excepthook (the agent's, chained to Python's) with an exception, as Python does when one
   ends the main thread: the time that call takes is how long the dying job is held. Also an
   on-demand record of the same job through the `record` method (the agent's thread writes).
2. Idle cost: CPU used by an idle job with the agent over --idle seconds, records on
   (PROBING_RECORD=1) against off (0), same run, interleaved.
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
from pathlib import Path
from typing import Dict, List

BIN = Path(sys.executable).parent
TARGETS = Path(__file__).resolve().parent.parent / "tests" / "targets"

DYING_JOB = """
import json, sys, time
import torch
from probing.agent.pytorch import tracer as torchtrace
rows = int(sys.argv[1])
active = torchtrace.tracer()
active.clock.new_ring(rows * 17 // 15)  # a ring holds 15/16 of its capacity at least
ring = active.ring
names = [f"model.layers.{i}" for i in range(12)]
modules = [ring.code(name) for name in names]
kinds = ring.code("Linear")
stages = [ring.code(stage) for stage in ("forward", "backward", "optimizer")]
now = time.time()
for index in range(rows):
    step, seq = divmod(index, 36)
    ring.append((step, seq, modules[seq % 12], kinds, stages[seq // 12], 0.001, 0.0001 * seq,
                 None, None, None, 0, now, 1))  # session 1: the trace was turned on once
print("ready", len(ring), flush=True)
sys.stdin.readline()
try:
    raise RuntimeError("the job dies here")
except RuntimeError:
    kind, value, tb = sys.exc_info()
started = time.perf_counter()
sys.excepthook(kind, value, tb)
print(json.dumps({"held_s": time.perf_counter() - started}), flush=True)
"""


def dying_job(rows: int, directory: str) -> Dict[str, float]:
    env = dict(os.environ, PROBING="1", PROBING_RECORD_DIR=directory, PROBING_SOCKET_DIR=directory + "-sock")
    env["PROBING_RECORD_KEEP"] = "100"
    process = subprocess.Popen(
        [sys.executable, "-c", DYING_JOB, str(rows)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env, text=True,
    )  # fmt: skip
    assert process.stdout is not None and process.stdin is not None
    ready = process.stdout.readline().split()
    assert ready[:1] == ["ready"], ready
    from probing.engine.target import Target

    with Target(str(process.pid), no_attach=True).connect(30.0) as client:
        on_demand, _ = client.call("record", {"kind": "on_demand"}, timeout=120.0)
    process.stdin.write("die\n")
    process.stdin.flush()
    held = json.loads(process.stdout.readline())["held_s"]
    process.wait(60)
    records = sorted(Path(directory).glob("*.probing"), key=lambda path: path.stat().st_mtime)
    from probing.protocol.records import read_record

    header = read_record(str(records[-1])).header
    return {
        "rows": int(ready[1]),
        "held_s": held,
        "header_write_s": header["write_seconds"],
        "bytes": records[-1].stat().st_size,
        "on_demand_s": on_demand["seconds"],
    }


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(setting: str, seconds: float, directory: str) -> float:
    env = dict(os.environ, PROBING="1", PROBING_RECORD=setting, PROBING_RECORD_DIR=directory)
    process = subprocess.Popen(
        [sys.executable, str(TARGETS / "dies.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    assert process.stdout is not None and process.stdin is not None
    assert process.stdout.readline().startswith(b"ready")
    start = cpu_seconds(process.pid)
    time.sleep(seconds)  # the measurement window itself
    used = cpu_seconds(process.pid) - start
    process.stdin.close()
    process.wait(30)
    return used


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--idle", type=float, default=10.0)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        results: List[Dict[str, float]] = []
        for run in range(options.runs):
            directory = os.path.join(scratch, f"records-{run}")
            results.append(dying_job(options.rows, directory))
        print(
            f"record of a job whose python.torch_trace holds {int(results[0]['rows'])} rows (synthetic fill):"
        )
        for key, label in (
            ("held_s", "dying job held (excepthook: build + write + fsync)"),
            ("header_write_s", "of which building the tables (header's write_seconds)"),
            ("on_demand_s", "on-demand record (`record` method, agent thread)"),
        ):
            values = [result[key] for result in results]
            print(f"  {label:58s} median {statistics.median(values) * 1000:8.1f} ms  (runs: "
                  f"{', '.join(f'{value * 1000:.0f}' for value in values)} ms)")  # fmt: skip
        size = statistics.median(result["bytes"] for result in results)
        print(f"  record size {size / 1e6:.1f} MB; {size / results[0]['rows']:.1f} bytes per trace row")
        on, off = [], []
        for _ in range(2):
            on.append(idle_cpu("1", options.idle / 2, os.path.join(scratch, "idle-on")))
            off.append(idle_cpu("0", options.idle / 2, os.path.join(scratch, "idle-off")))
        ratio = f"{sum(on) / sum(off):.2f}" if sum(off) else "n/a (off used no tick)"
        print(f"idle job CPU over {options.idle:g} s: records on {sum(on):.3f} s, off {sum(off):.3f} s; "
              f"ratio on/off {ratio} (clock ticks are 10 ms)")  # fmt: skip


if __name__ == "__main__":
    main()
