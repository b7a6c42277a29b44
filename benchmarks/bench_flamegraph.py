"""What `probing PID flamegraph --duration 10` costs a training job.

A small transformer trains on CPU (4 encoder layers, d=128, batch 16, sequence 32, one torch
thread) under `probing run`, logging every step's start and length. Windows of --window seconds
alternate, round by round, between untouched and sampled (`flamegraph --duration WINDOW`), the
order swapped every round so that drift on a shared machine hits both alike. Reported: the
median step time in each kind of window, their ratio (the target is <= 1.01), and the rate the
agent achieved, its samples, and the share of time its sampling held the GIL.

    .venv/bin/python benchmarks/bench_flamegraph.py [--rounds 3] [--window 10]
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
from typing import List, Tuple

PROBING = [sys.executable, "-m", "probing"]
JOB = """
import sys, time
import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
model = nn.Sequential(nn.Embedding(500, 128), nn.TransformerEncoder(layer, num_layers=4,
                      enable_nested_tensor=False), nn.Linear(128, 500))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
tokens = torch.randint(0, 500, (16, 32))
targets = torch.randint(0, 500, (16, 32))
print("ready", flush=True)
with open(sys.argv[1], "w", buffering=1) as log:
    while True:
        started = time.monotonic()
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(tokens).reshape(-1, 500), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        log.write(f"{started:.6f} {time.monotonic() - started:.6f}\\n")
"""
WROTE = re.compile(
    r"(\d+) samples in ([\d.]+) s \(([\d.]+) Hz\) from the agent; sampling held the GIL ([\d.]+)%"
)


def steps(log: str) -> List[Tuple[float, float]]:
    if not os.path.exists(log):  # the job has not begun its first step
        return []
    with open(log) as handle:
        lines = handle.read().splitlines()
    found = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            found.append((float(parts[0]), float(parts[1])))
    return found


def inside(timed: List[Tuple[float, float]], start: float, end: float) -> List[float]:
    return [took for at, took in timed if start <= at and at + took <= end]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=10.0)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-flame-") as directory:
        script, log = os.path.join(directory, "job.py"), os.path.join(directory, "steps.log")
        with open(script, "w") as handle:
            handle.write(JOB)
        job = subprocess.Popen(
            [*PROBING, "run", "--", sys.executable, script, log], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert job.stdout is not None and job.stderr is not None
            pid = int(job.stderr.readline().split()[3].rstrip(":"))  # probing: started PID N: ...
            job.stdout.readline()  # ready
            while len(steps(log)) < 10:
                time.sleep(0.1)
            plain: List[Tuple[float, float]] = []
            sampled: List[Tuple[float, float]] = []
            figures = []
            for round_number in range(options.rounds):
                for kind in ("plain", "sampled") if round_number % 2 == 0 else ("sampled", "plain"):
                    start = time.monotonic()
                    if kind == "plain":
                        time.sleep(options.window)
                        plain.append((start, time.monotonic()))
                        continue
                    out = os.path.join(directory, "cpu.folded")
                    result = subprocess.run(
                        [*PROBING, str(pid), "flamegraph", "--duration", str(options.window), "-o", out],
                        capture_output=True, text=True,
                    )  # fmt: skip
                    sampled.append((start, time.monotonic()))
                    said = WROTE.search(result.stderr)
                    if result.returncode != 0 or said is None:
                        print(result.stderr, file=sys.stderr)
                        return 1
                    figures.append((int(said[1]), float(said[2]), float(said[3]), float(said[4])))
            timed = steps(log)
        finally:
            job.kill()
            job.wait()
    rounds = []
    for plain_window, sampled_window in zip(plain, sampled):
        untouched = inside(timed, *plain_window)
        during = inside(timed, *sampled_window)
        if untouched and during:
            rounds.append(statistics.median(during) / statistics.median(untouched))
    plain_steps = [took for start, end in plain for took in inside(timed, start, end)]
    sampled_steps = [took for start, end in sampled for took in inside(timed, start, end)]
    plain_median, sampled_median = statistics.median(plain_steps), statistics.median(sampled_steps)
    print(f"rounds {options.rounds}, windows of {options.window:g} s; steps: {len(plain_steps)} plain, "
          f"{len(sampled_steps)} sampled")  # fmt: skip
    print(f"median step, not sampled: {plain_median * 1000:.2f} ms")
    print(f"median step, sampled:     {sampled_median * 1000:.2f} ms")
    print(f"ratio sampled / not sampled: {sampled_median / plain_median:.4f} (target <= 1.01)")
    print("ratio per round (adjacent windows): " + ", ".join(f"{ratio:.4f}" for ratio in rounds))
    if rounds:
        print(f"median of the round ratios: {statistics.median(rounds):.4f}")
    for samples, seconds, rate, share in figures:
        print(
            f"  sampling: {samples} samples in {seconds:.2f} s, {rate:.1f} Hz achieved, GIL held {share:.3f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
