"""What recording collectives costs a training step: PyTorch's Flight Recorder on (torch's default)
against off, and probing's own recording (collective_recorder.py, used where the Flight Recorder
is off) on against off; and what reading python.collectives costs the job.

A small DDP job: 2 ranks under torchrun, gloo, CPU, a 3-layer MLP (d=256, batch 32). Each step is
a forward, a backward (DDP all-reduces the gradient bucket from C++), an optimizer step and a
`dist.all_reduce` of the loss from Python (the call probing's wrappers see; DDP's bucket they do
not). Jobs with the Flight Recorder on and off are launched alternately, round by round, so drift
on a shared machine hits both alike; inside each job, blocks of steps with probing's recording
on and off alternate. Reported: median step times and their ratios.

    .venv/bin/python benchmarks/bench_collectives.py [--rounds 3] [--blocks 4] [--steps 75]
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
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
# Collectives issued before the dump is timed: the Flight Recorder's ring (2000) full.
FILL_RING = 2200


def worker(blocks: int, steps: int) -> None:
    """One rank: alternate blocks of steps with probing's recording off and on."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from probing.agent.pytorch import collective_recorder, collectives
    from probing.agent.pytorch.collectives import collective_rows, flight_recorder_dump

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(32, 256), torch.randint(0, 10, (32,))
    loss_fn = nn.CrossEntropyLoss()

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        return time.perf_counter() - start

    for _ in range(20):
        step()
    small = torch.zeros(1)

    def one_call() -> float:
        start = time.perf_counter()
        dist.all_reduce(small)
        return time.perf_counter() - start

    times: Dict[str, List[float]] = {"plain": [], "recorded": [], "call_plain": [], "call_recorded": []}
    for _ in range(blocks):
        for mode in ("plain", "recorded"):
            if mode == "recorded":
                collective_recorder.recorder(dist.distributed_c10d, dist)
            times[mode] += [step() for _ in range(steps)]
            times["call_" + mode] += [one_call() for _ in range(steps * 4)]
            if mode == "recorded":
                collective_recorder.stop()
    # The recording's own work per call, without the communication around it: steadier on a
    # shared machine than the difference of two timed all_reduces.
    own = collective_recorder.CollectiveRecorder(dist.distributed_c10d, dist)
    tensor_argument = collective_recorder.Argument(dist.all_reduce, "tensor")
    group_argument = collective_recorder.Argument(dist.all_reduce, "group")
    start = time.perf_counter()
    for _ in range(FILL_RING):
        noted = own.begin("all_reduce", (small,), {}, [tensor_argument], [tensor_argument], group_argument)
        own.returned(noted, None)
    times["own_work"] = [(time.perf_counter() - start) / FILL_RING]
    # What a query costs the job: python.collectives read with the ring that serves it full.
    if flight_recorder_dump() is None:
        collective_recorder.recorder(dist.distributed_c10d, dist)
    collectives.DUMP_FRESH_S = 0.0  # every read below dumps afresh
    for _ in range(FILL_RING):
        dist.all_reduce(small)
    reads = []
    for _ in range(20):
        start = time.perf_counter()
        found, _ = collective_rows(())
        reads.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        summary = {mode: statistics.median(values) for mode, values in times.items()}
        summary["read_s"] = statistics.median(reads)
        summary["read_rows"] = len(found)
        print("RESULT " + json.dumps(summary), flush=True)
    dist.destroy_process_group()


def launch(flight_recorder: bool, blocks: int, steps: int) -> Dict[str, Any]:
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    environment.pop("PROBING", None)
    if flight_recorder:
        environment.pop("TORCH_FR_BUFFER_SIZE", None)
        environment.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
    else:
        environment["TORCH_FR_BUFFER_SIZE"] = "0"
    command = [TORCHRUN, "--standalone", "--nproc-per-node=2", os.path.abspath(__file__),
               "--worker", "--blocks", str(blocks), "--steps", str(steps)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            found: Dict[str, Any] = json.loads(line[len("RESULT ") :])
            return found
    raise RuntimeError(f"no result from the job:\n{done.stdout}\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=75)
    parser.add_argument("--worker", action="store_true")
    options = parser.parse_args()
    if options.worker:
        worker(options.blocks, options.steps)
        return
    results: Dict[bool, List[Dict[str, Any]]] = {True: [], False: []}
    for _ in range(options.rounds):
        for flight_recorder in (True, False):
            results[flight_recorder].append(launch(flight_recorder, options.blocks, options.steps))

    def median(flight_recorder: bool, key: str) -> float:
        return statistics.median(result[key] for result in results[flight_recorder])

    def spread(key: str) -> str:
        # Jobs launched one after the other, paired round by round: the ratio of each pair.
        ratios = sorted(on[key] / off[key] for on, off in zip(results[True], results[False]))
        return f"{statistics.median(ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)})"

    per_job = 2 * options.blocks * options.steps
    print(f"DDP, 2 ranks, gloo, CPU; {options.rounds} rounds of 2 jobs, {per_job} timed steps each (median)")
    on, off = median(True, "plain"), median(False, "plain")
    print(f"  step, Flight Recorder on (default): {on * 1e3:7.3f} ms")
    print(f"  step, Flight Recorder off:          {off * 1e3:7.3f} ms")
    print(f"    FR on/off, per step:              {spread('plain')}")
    print(f"    FR on/off, per all_reduce call:   {spread('call_plain')}")
    for flight_recorder, label in ((False, "FR off"), (True, "FR on ")):
        plain, recorded = median(flight_recorder, "plain"), median(flight_recorder, "recorded")
        call, call_recorded = median(flight_recorder, "call_plain"), median(flight_recorder, "call_recorded")
        extra = (call_recorded - call) * 1e6
        print(f"  probing's recording on/off, {label}: per step {recorded / plain:.3f}, per all_reduce "
              f"{call_recorded / call:.3f} ({extra:+.1f} us on {call * 1e6:.1f} us)")  # fmt: skip
    own = statistics.median(result["own_work"] for result in results[True] + results[False])
    print(f"  probing's recording, its own work per call (no communication): {own * 1e6:.1f} us")
    for flight_recorder, label in ((True, "FR on "), (False, "FR off")):
        read = median(flight_recorder, "read_s")
        rows = results[flight_recorder][0]["read_rows"]
        print(f"  reading python.collectives, {label}: {read * 1e3:6.2f} ms for {rows} rows "
              f"= {read / median(flight_recorder, 'plain'):.2f} steps")  # fmt: skip


if __name__ == "__main__":
    main()
