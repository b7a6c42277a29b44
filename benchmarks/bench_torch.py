"""What `probing PID trace on` costs a training job, and what a query over 1 M traced rows costs.

Part 1, step-time overhead (in this process, through the same tracer the agent drives): a small
transformer trained on CPU (6 encoder layers, d=256, batch 32, sequence 64) runs blocks of steps
untraced, traced with the defaults, traced every step and every module, and every step with
backward timing, interleaved round by round so that drift on a shared machine hits every mode
alike. Reported: median step time per mode, its ratio to untraced, and the cost per hook call
(the extra time per step divided by the hook calls a traced step makes).

Part 2, a 1 M-row query: a job started with `probing run` (benchmarks/torch_target.py) is traced
until python.torch_trace holds a million rows; the seed query is then run through the CLI
several times, end to end, while the job's training thread logs the gap between its steps: the
longest gap during the queries against the longest in equal windows without them.

    .venv/bin/python benchmarks/bench_torch.py [--rounds 7] [--steps 6] [--skip-query]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
PROBING = [sys.executable, "-m", "probing"]
SEED_QUERY = (
    "SELECT module, stage, avg(duration) as avg_time FROM python.torch_trace "
    "WHERE step > (SELECT max(step) - 5 FROM python.torch_trace) "
    "GROUP BY module, stage ORDER BY avg_time DESC LIMIT 10;"
)


def overhead(rounds: int, steps: int, device: str) -> Dict[str, Any]:
    import torch
    from torch import nn

    from probing.agent.pytorch import tracer as torchtrace

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True)
    model = nn.Sequential(
        nn.Embedding(1000, 256), nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False),
        nn.Linear(256, 1000),
    ).to(device)  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    tokens = torch.randint(0, 1000, (32, 32), device=device)
    targets = torch.randint(0, 1000, (32, 32), device=device)

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(tokens).reshape(-1, 1000), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        if device != "cpu":
            torch.cuda.synchronize()  # the benchmark's own clock, not the tracer's
        return time.perf_counter() - start

    tracer = torchtrace.tracer()
    modes = {
        "untraced": None,
        "untraced again (the noise floor)": None,
        "default (--every chosen by the tracer)": dict(every=None, backward=False),
        "every step, every module": dict(every=1, backward=False),
        "every step, every module, --backward": dict(every=1, backward=True),
        "nan on (every output and gradient checked)": dict(nan=True),
        "nan on --stop": dict(nan=True, stop=True),
    }
    times: Dict[str, List[float]] = {mode: [] for mode in modes}
    hooks_per_step: Dict[str, float] = {}
    chosen: List[Dict[str, float]] = []  # what the default mode's tracer chose and measured
    for _ in range(3):
        step()  # warm up
    # Modes take turns in short blocks, round after round, so that the machine's drift falls on
    # every mode alike; each mode's figure is the median of its steps. The first step after a
    # switch is not timed: `trace on` walks the heap with gc to find the models, which leaves
    # the next step slower whatever it traces.
    for _ in range(rounds):
        for mode, options in modes.items():
            tracer.trace_off()
            tracer.configure_nan(False, False)
            if options and options.get("nan"):
                tracer.configure_nan(True, bool(options.get("stop")))
            elif options:
                tracer.configure_trace(options["every"], options["backward"], None, None, None)
            step()
            rows_before = len(tracer.ring)
            times[mode] += [step() for _ in range(steps)]
            if options is not None:
                hooks_per_step[mode] = (len(tracer.ring) - rows_before) / steps
            if options and options.get("every", 0) is None:
                clock = tracer.clock
                chosen.append({"every": clock.every, "traced_step_cost_s": clock.traced_cost})
    tracer.trace_off()
    tracer.configure_nan(False, False)
    base = statistics.median(times["untraced"])
    base_mean = statistics.mean(times["untraced"])
    report: Dict[str, Any] = {
        "device": device, "modules": len(list(model.modules())) + 1, "steps_per_mode": len(times["untraced"]),
        "base_s": base, "modes": {}, "chosen": chosen,
    }  # fmt: skip
    # The median is a typical step; the mean is what the job pays, where one step in N is traced.
    for mode, values in times.items():
        median, mean = statistics.median(values), statistics.mean(values)
        entry = {"median_step_ms": round(median * 1000, 2), "ratio": round(median / base, 4),
                 "mean_step_ms": round(mean * 1000, 2), "mean_ratio": round(mean / base_mean, 4)}  # fmt: skip
        rows = hooks_per_step.get(mode)
        if rows:
            entry["rows_per_step"] = rows
        report["modes"][mode] = entry
    return report


def per_call(device: str, calls: int = 20000) -> Dict[str, float]:
    """The tracer's cost per traced module call, in microseconds: a chain of 50 nn.Identity
    modules called with and without hooks, forward only and with backward timing."""
    import torch
    from torch import nn

    from probing.agent.pytorch import tracer as torchtrace

    chain = nn.Sequential(*[nn.Sequential(nn.Identity(), nn.Linear(4, 4)) for _ in range(25)]).to(device)
    optimizer = torch.optim.SGD(chain.parameters(), lr=0.0)
    data = torch.randn(2, 4, device=device)
    calls_per_pass = len(list(chain.modules()))
    tracer = torchtrace.tracer()

    def timed(backward: bool) -> float:
        passes = max(1, calls // calls_per_pass)
        start = time.perf_counter()
        for _ in range(passes):
            out = chain(data)
            if backward:
                out.sum().backward()
            optimizer.step()
        if device != "cpu":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / passes

    result = {}
    for label, backward in (("forward", False), ("forward+backward", True)):
        samples = {"off": [], "on": []}
        for _ in range(5):
            tracer.trace_off()
            samples["off"].append(timed(backward))
            tracer.configure_trace(1, backward, None, None, None)
            samples["on"].append(timed(backward))
        tracer.trace_off()
        extra = statistics.median(samples["on"]) - statistics.median(samples["off"])
        result[label] = round(extra / calls_per_pass * 1e6, 2)
    return result


def _probing(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PROBING, *args], capture_output=True, text=True, timeout=timeout)


def query_million(repeats: int) -> Dict[str, Any]:
    log = os.path.join("/tmp", f"bench_torch_gaps_{os.getpid()}.log")
    job = subprocess.Popen(
        [*PROBING, "run", "--", sys.executable, os.path.join(HERE, "torch_target.py"), log],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert job.stdout is not None and job.stderr is not None
        pid = int(job.stderr.readline().split()[3].rstrip(":"))  # probing: started PID N: ...
        job.stdout.readline()  # ready
        # Room above a million: the ring drops its oldest sixteenth at a time.
        status = _probing(
            str(pid), "trace", "on", "--every", "1", "--capacity", "1100000", "--format", "json"
        )
        if status.returncode != 0:
            raise SystemExit(f"trace on failed: {status.stderr}")
        started = time.monotonic()
        while True:
            rows = json.loads(_probing(str(pid), "trace", "status", "--format", "json").stdout)["rows"]
            if rows >= 1_000_000 or time.monotonic() - started > 300:
                break
            time.sleep(1.0)
        fill_s = time.monotonic() - started
        windows = []
        durations = []
        for _ in range(repeats):
            time.sleep(1.0)
            idle = (time.time() - 0.8, time.time())
            begin = time.time()
            result = _probing(str(pid), "query", SEED_QUERY)
            end = time.time()
            if result.returncode != 0:
                raise SystemExit(f"query failed: {result.stderr}")
            durations.append(end - begin)
            windows.append((idle, (begin, end)))
        time.sleep(0.5)
        count = _probing(str(pid), "query", "SELECT count(*) FROM python.torch_trace", "--format", "csv")
        gaps = _read_gaps(log)
    finally:
        job.terminate()
        job.wait(timeout=10)
        if os.path.exists(log):
            os.unlink(log)

    def longest(lo: float, hi: float) -> float:
        inside = [gap for at, gap in gaps if lo <= at <= hi + 0.05]
        return max(inside) if inside else 0.0

    during = [longest(*window) for _, window in windows]
    idle = [longest(*window) for window, _ in windows]
    return {
        "rows": int(count.stdout.splitlines()[1]) if count.returncode == 0 else None,
        "fill_seconds": round(fill_s, 1),
        "query_seconds": [round(d, 3) for d in durations],
        "query_median_s": round(statistics.median(durations), 3),
        "longest_step_gap_during_query_ms": round(max(during) * 1000, 1),
        "longest_step_gap_idle_ms": round(max(idle) * 1000, 1),
    }


def _read_gaps(path: str) -> List[tuple[float, float]]:
    gaps = []
    with open(path) as handle:
        for line in handle:
            at, gap = line.split()
            gaps.append((float(at), float(gap)))
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--skip-query", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    if not args.skip_overhead:
        report = overhead(args.rounds, args.steps, args.device)
        costs = per_call(args.device)
        print(
            f"step-time overhead, small transformer on {report['device']} ({report['modules']} modules), "
            f"{report['steps_per_mode']} steps per mode, modes taking turns; median step and mean step "
            "(the mean carries the one traced step in N):"
        )
        for mode, entry in report["modes"].items():
            extra = ""
            rows = entry.get("rows_per_step")
            if rows:
                # The measured ratio drowns in the machine's noise (see the noise floor); the
                # estimate is rows per step times the cost per call measured below.
                per_call_us = costs["forward+backward"] / 2 if "--backward" in mode else costs["forward"]
                estimate = 1 + rows * per_call_us * 1e-6 / report["base_s"]
                extra = f"  {rows:.0f} rows/step, estimated x{estimate:.4f}"
            print(f"  {mode:44s} median {entry['median_step_ms']:8.2f} ms x{entry['ratio']:.4f}  "
                  f"mean {entry['mean_step_ms']:8.2f} ms x{entry['mean_ratio']:.4f}{extra}")  # fmt: skip
        if report["chosen"]:
            every = statistics.median(entry["every"] for entry in report["chosen"])
            cost = statistics.median(entry["traced_step_cost_s"] for entry in report["chosen"])
            print(
                f"default, as the tracer measured it: one step in {every:.0f} traced, a traced step's hooks "
                f"{cost * 1000:.2f} ms: x{1 + cost / (every * report['base_s']):.4f} over every step"
            )
        print(
            f"cost per traced module call (50-module chain, median of 5): {costs['forward']} us forward; "
            f"{costs['forward+backward']} us per module with --backward (its forward and backward rows, "
            "hooks and graph walk)"
        )
    if not args.skip_query:
        result = query_million(args.repeats)
        print(
            f"seed query over {result['rows']} rows of python.torch_trace "
            f"(filled in {result['fill_seconds']} s):"
        )
        print(f"  end to end: median {result['query_median_s']} s  (runs: {result['query_seconds']})")
        print(
            f"  longest training-step gap during the queries: {result['longest_step_gap_during_query_ms']} ms"
            f" (in equal windows without: {result['longest_step_gap_idle_ms']} ms)"
        )


if __name__ == "__main__":
    main()
