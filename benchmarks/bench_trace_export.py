"""`probing PID trace export` of a million-row python.torch_trace: time, file size and the CLI's
peak memory, against reading the same rows with `probing PID query` in the same run.

A job with torch imported fills its tracer's ring synthetically (a real 1 M-row trace takes
hours of steps), shaped like a 12-layer model's traced steps: the model's forward around its
layers', the loss, the backward passes, the optimizer, 28 rows a step, times that nest as the
hooks would stamp them. With --cuda-columns every row carries allocated/reserved values that
change (the worst case for counters). With --one-step every row is in step 0 (an inference or
eval job: python.torch_trace counts optimizer steps, so its steps never advance), the model
called again and again within the step: one step of a million rows. Then, alternately, each a
new `probing` process:

- export:   probing PID trace export -o FILE
- baseline: probing PID query "SELECT * FROM python.torch_trace" --format csv > /dev/null
- fetch:    probing PID query "SELECT count(*) FROM python.torch_trace" (the rows reach the CLI,
            nothing is made of them: what the export spends beyond it is making the events)

Reported: the median of each, their ratio, the file's size and events, and each command's peak
RSS (from wait4), which shows whether the export streams.

    .venv/bin/python benchmarks/bench_trace_export.py [--rows 1000000] [--repeats 3] [--cuda-columns]
                                                      [--one-step]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

PROBING = os.path.join(os.path.dirname(sys.executable), "probing")

FILLED_JOB = """
import sys, time
import torch
from probing.agent.pytorch import tracer as torchtrace
rows, cuda, one_step = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
active = torchtrace.tracer()
active.clock.new_ring(rows * 17 // 15)  # a ring holds 15/16 of its capacity at least
ring = active.ring
layers = [ring.code(f"model.layers.{i}") for i in range(12)]
model, loss, optimizer = ring.code("model"), ring.code("loss_fn"), ring.code("optimizer")
linear, sequential, mse, adamw = (ring.code(name) for name in ("Linear", "Sequential", "MSELoss", "AdamW"))
forward, backward, optimize = (ring.code(stage) for stage in ("forward", "backward", "optimizer"))
step_s = 0.010
steps = rows // 28 + 1
start = time.time() - steps * step_s
count = 0
for step in range(steps):
    t0 = start + step * step_s
    calls = [(model, sequential, forward, 0.0, 0.004)]
    calls += [(layers[i], linear, forward, 0.0001 + i * 0.0003, 0.00029) for i in range(12)]
    calls += [(loss, mse, forward, 0.0042, 0.0002)]
    calls += [(model, sequential, backward, 0.0045, 0.004)]
    calls += [(layers[11 - i], linear, backward, 0.0046 + i * 0.0003, 0.00028) for i in range(12)]
    calls += [(optimizer, adamw, optimize, 0.009, 0.0008)]
    for seq, (name, kind, stage, offset, duration) in enumerate(calls):
        memory = (1000.0 + (count % 97), 2000.0, 2048.0 + (count // 1000) % 7) if cuda else (None, None, None)
        in_step = step * step_s + offset if one_step else offset
        number = 0 if one_step else step
        order = count if one_step else seq
        ring.append((number, order, name, kind, stage, duration, in_step, *memory, 0, t0 + offset, 1))
        count += 1
        if count == rows:
            break
    if count == rows:
        break
print("ready", len(ring), flush=True)
sys.stdin.readline()
"""


def timed(command: List[str], stdout: Any) -> Tuple[float, int, subprocess.CompletedProcess[str]]:
    """Seconds, peak RSS in kB (wait4's, this child only), and the result."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    stderr = process.stderr.read() if process.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    process.returncode = code
    assert code == 0, (command, stderr)
    return seconds, usage.ru_maxrss, subprocess.CompletedProcess(command, code, None, stderr)


def run(rows: int, repeats: int, cuda: bool, one_step: bool) -> Dict[str, Any]:
    scratch = tempfile.mkdtemp(prefix="bench_trace_export_")
    env = dict(os.environ, PROBING="1", PROBING_SOCKET_DIR=os.path.join(scratch, "sock"))
    job = subprocess.Popen(
        [sys.executable, "-c", FILLED_JOB, str(rows), "1" if cuda else "0", "1" if one_step else "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True,
    )  # fmt: skip
    try:
        assert job.stdout is not None
        ready = job.stdout.readline().split()
        assert ready[:1] == ["ready"], ready
        held = int(ready[1])
        output = os.path.join(scratch, "step.json")
        cli_env = {"PROBING_SOCKET_DIR": env["PROBING_SOCKET_DIR"]}
        os.environ.update(cli_env)
        export_runs, query_runs, fetch_runs = [], [], []
        query = [PROBING, str(job.pid), "query"]
        for _ in range(repeats):
            seconds, rss, result = timed([PROBING, str(job.pid), "trace", "export", "-o", output], None)
            export_runs.append((seconds, rss, result.stderr.strip()))
            with open(os.devnull, "w") as devnull:
                seconds, rss, _ = timed(
                    [*query, "SELECT * FROM python.torch_trace", "--format", "csv"], devnull
                )
                query_runs.append((seconds, rss))
                seconds, rss, _ = timed([*query, "SELECT count(*) FROM python.torch_trace"], devnull)
                fetch_runs.append((seconds, rss))
        size = os.path.getsize(output)
        with open(output) as file:
            events = len(json.load(file)["traceEvents"])
    finally:
        if job.stdin:
            job.stdin.close()
        job.wait(60)
        shutil.rmtree(scratch, ignore_errors=True)
    export_s = statistics.median(run[0] for run in export_runs)
    query_s = statistics.median(run[0] for run in query_runs)
    return {
        "rows": held,
        "cuda_columns": cuda,
        "one_step": one_step,
        "export_s": round(export_s, 2),
        "query_csv_s": round(query_s, 2),
        "export_over_query": round(export_s / query_s, 2),
        "fetch_only_s": round(statistics.median(run[0] for run in fetch_runs), 2),
        "file_mb": round(size / 1e6, 1),
        "events": events,
        "bytes_per_row": round(size / held, 1),
        "export_peak_rss_mb": round(max(run[1] for run in export_runs) / 1024, 1),
        "query_peak_rss_mb": round(max(run[1] for run in query_runs) / 1024, 1),
        "said": export_runs[-1][2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cuda-columns", action="store_true")
    parser.add_argument("--one-step", action="store_true", help="every row in step 0")
    options = parser.parse_args()
    result = run(options.rows, options.repeats, options.cuda_columns, options.one_step)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
