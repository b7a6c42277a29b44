"""A 4-rank DDP training job (gloo, CPU) that is slow, not stuck: rank 2 reads its shards from a
slow disk, 25 ms late for every batch, and the whole job waits for it at every all_reduce.

    python docs/examples/ddp_slow.py

This file is its own torchrun, as ddp_stuck.py is: run plainly, it starts torchrun's elastic
agent in this process, which starts 4 ranks of this file with --worker. Nothing of probing is in
the job. It prints "ready" once every rank has taken a few steps.
"""

import argparse
import os
import sys
import tempfile
import time

parser = argparse.ArgumentParser()
parser.add_argument("--worker", action="store_true")
options = parser.parse_args()
SLOW_RANK = 2


def read_shard(rank: int, index: int) -> list:
    """One batch of this rank's shard; rank 2's disk is slow."""
    if rank == SLOW_RANK:
        time.sleep(0.025)
    return [float(index % 7)] * 16


def train(arrived: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    class Shard(torch.utils.data.Dataset):
        def __init__(self, rank: int) -> None:
            self.rank = rank

        def __len__(self) -> int:
            return 10**9

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.tensor(read_shard(self.rank, index)).repeat(8, 1)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = torch.utils.data.DataLoader(Shard(rank), batch_size=None)
    for step, batch in enumerate(batches):
        if step == 5:
            # Each rank says it got here; the last to arrive tells the launcher all are in place.
            open(os.path.join(arrived, str(rank)), "w").close()
            if len(os.listdir(arrived)) == dist.get_world_size():
                os.write(1, b"ready\n")
        optimizer.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()  # DDP all_reduces the gradients here
        optimizer.step()
        time.sleep(0.01)


if options.worker:
    train(os.environ["ARRIVED_DIR"])
else:
    from torch.distributed.run import main

    os.environ["ARRIVED_DIR"] = tempfile.mkdtemp(prefix="ddp-slow-")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(["--standalone", "--nproc-per-node=4", __file__, "--worker"])
    sys.exit(0)
