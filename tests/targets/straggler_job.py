"""A DDP training loop under torchrun (gloo, CPU) whose ranks can be made slow, for `stragglers`.

    --slow-data RANK:MS[,RANK:MS]     the rank's ShardReader.read sleeps MS more for each batch
    --slow-forward RANK:MS[,...]      the rank's forward multiplies matrices for MS more
    --stuck RANK                      the rank's data loading never returns from step --step on
    --step-log PATH                   rank 0 appends `END_EPOCH_S SECONDS` for each step to PATH

Every rank prints `ready <rank> <pid>` once its slowness is in place (after a few steps), or just
before it gets stuck. Each rank runs until the test kills the job.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--slow-data", default="")
parser.add_argument("--slow-forward", default="")
parser.add_argument("--stuck", type=int, default=-1)
parser.add_argument("--step", type=int, default=5)
parser.add_argument("--step-log", default="")
options = parser.parse_args()


def per_rank(text: str) -> dict:
    return {int(rank): float(ms) / 1000 for rank, ms in (pair.split(":") for pair in text.split(",") if pair)}


SLOW_DATA, SLOW_FORWARD = per_rank(options.slow_data), per_rank(options.slow_forward)


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())  # one write: the ranks share torchrun's stdout


class ShardReader:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.reads = 0

    def read(self) -> torch.Tensor:
        self.reads += 1
        if self.rank == options.stuck and self.reads > options.step:
            say(f"ready {self.rank} {os.getpid()}")
            time.sleep(3600)  # the shard that never arrives
        if self.rank in SLOW_DATA:
            time.sleep(SLOW_DATA[self.rank])  # a slow disk
        return torch.randn(8, 32)


class Shards(torch.utils.data.Dataset):
    def __init__(self, reader: ShardReader) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.reader.read()


class Net(torch.nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.first = torch.nn.Linear(32, 64)
        self.second = torch.nn.Linear(64, 8)
        self.large = torch.randn(192, 192)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        if self.rank in SLOW_FORWARD:
            started = time.perf_counter()
            while time.perf_counter() - started < SLOW_FORWARD[self.rank]:
                self.large @ self.large  # a larger matmul than the others do
        return self.second(torch.relu(self.first(batch)))


def train() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(Net(rank))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Shards(ShardReader(rank)), batch_size=None)
    log = open(options.step_log, "a") if options.step_log and rank == 0 else None
    last = time.perf_counter()
    for step, batch in enumerate(loader):
        loss = model(batch).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.01)  # the loop's own bookkeeping
        now = time.perf_counter()
        if log is not None:
            log.write(f"{time.time():.6f} {now - last:.6f}\n")
            log.flush()
        last = now
        if step == 3 and rank != options.stuck:
            say(f"ready {rank} {os.getpid()}")


train()
