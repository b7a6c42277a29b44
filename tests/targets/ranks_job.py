"""A distributed training loop for the --ranks tests: run it under torchrun (gloo, CPU; or
--backend nccl, one GPU per rank).

    --scenario healthy    every rank trains forever: a small step, an all_reduce, a short pause
    --scenario stall      rank --rank-at stalls in load_shard() before the all_reduce of step --step
    --scenario gil        rank --rank-at holds the GIL in a C call (libc sleep) at that step
    --scenario mismatch   rank --rank-at calls a broadcast where the others all_reduce at that step
    --scenario idle       after one all_reduce, every rank sleeps in a loop outside any collective
                          (so that one rank can die without the others failing in gloo)
    --scenario asyncio    after one all_reduce, every rank runs an asyncio loop whose two tasks
                          "fetch-0", "fetch-1" wait on an Event; rank --rank-at has a third,
                          "stuck-fetch", asleep

Every rank prints `ready <rank> <pid>` once the state under test exists, or is about to: for
stall/gil/mismatch, just before the step where it goes wrong (the stuck rank just before it
stalls; the others just before they enter the collective that cannot complete). Healthy ranks
say ready after their first step. Each rank exits when the job's stdin closes (torchrun gives
it none: the test kills the job).
"""

import argparse
import asyncio
import ctypes
import os
import sys
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
SCENARIOS = ("healthy", "stall", "gil", "mismatch", "idle", "asyncio")
parser.add_argument("--scenario", choices=SCENARIOS, default="healthy")
parser.add_argument("--rank-at", type=int, default=2)
parser.add_argument("--step", type=int, default=5)
parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")  # nccl: one GPU per rank
options = parser.parse_args()


def say(line: str) -> None:
    # write(2) in one call: ranks share torchrun's stdout, and a print may be split.
    os.write(1, f"{line}\n".encode())


def load_shard(step: int) -> None:
    """The data shard that never arrives."""
    time.sleep(3600)


def hold_the_gil() -> None:
    sys.setswitchinterval(1000.0)
    ctypes.PyDLL(None).sleep(3600)


async def fetch(event: asyncio.Event) -> None:
    await event.wait()


async def serve(rank: int) -> None:
    event = asyncio.Event()
    tasks = [asyncio.create_task(fetch(event), name=f"fetch-{index}") for index in range(2)]
    if rank == options.rank_at:
        tasks.append(asyncio.create_task(asyncio.sleep(3600), name="stuck-fetch"))
    await asyncio.sleep(0.1)  # every task at its wait
    say(f"ready {rank} {os.getpid()}")
    await asyncio.gather(*tasks)


def train() -> None:
    device = torch.device("cpu")
    if options.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(options.backend)
    rank = dist.get_rank()
    model = torch.nn.Linear(16, 16).to(device)
    weights = torch.ones(16, device=device)
    for step in range(10**9):
        loss = model(torch.randn(4, 16, device=device)).sum()
        loss.backward()
        if options.scenario != "healthy" and step == options.step:
            say(f"ready {rank} {os.getpid()}")
            if rank == options.rank_at:
                if options.scenario == "stall":
                    load_shard(step)
                elif options.scenario == "gil":
                    hold_the_gil()
                elif options.scenario == "mismatch":
                    dist.broadcast(weights, 0)
                    continue
        dist.all_reduce(weights)
        if options.scenario == "asyncio":
            asyncio.run(serve(rank))
        if options.scenario == "idle":
            say(f"ready {rank} {os.getpid()}")
            while True:
                time.sleep(0.05)
        if options.scenario == "healthy":
            if step == 0:
                say(f"ready {rank} {os.getpid()}")
            time.sleep(0.02)


train()
