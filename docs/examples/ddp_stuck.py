"""A 4-rank DDP training job (gloo, CPU) in which one rank stops coming to the collectives.

    python docs/examples/ddp_stuck.py                 # rank 2 waits for a data shard at step 5
    python docs/examples/ddp_stuck.py --mismatch      # rank 2 broadcasts where the others all_reduce

This file is its own torchrun: run plainly, it starts torchrun's elastic agent in this process
(torch.distributed.run, as `torchrun --standalone --nproc-per-node 4` does), which starts 4
ranks of this file with --worker. Nothing of probing is in the job: probing attaches to the
ranks when asked. It prints "ready" once every rank is in place for the problem.
"""

import argparse
import os
import sys
import tempfile
import time

parser = argparse.ArgumentParser()
parser.add_argument("--worker", action="store_true")
parser.add_argument("--mismatch", action="store_true")
parser.add_argument("--ranks", type=int, default=4)
options = parser.parse_args()


def wait_for_shard(step: int) -> None:
    """The data shard of this rank never arrives (a stuck filesystem, a dead data server)."""
    time.sleep(3600)


def train(arrived: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10**9):
        if step == 5:
            # Each rank says it got here; the last to arrive tells the launcher all are in place.
            open(os.path.join(arrived, str(rank)), "w").close()
            if len(os.listdir(arrived)) == dist.get_world_size():
                os.write(1, b"ready\n")
            if rank == 2 and not options.mismatch:
                wait_for_shard(step)
            if options.mismatch:
                loss_scale = torch.ones(1)
                if rank == 2:
                    dist.broadcast(loss_scale, src=0)
                else:
                    dist.all_reduce(loss_scale)
        optimizer.zero_grad()
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()  # DDP all_reduces the gradients here
        optimizer.step()


if options.worker:
    train(os.environ["ARRIVED_DIR"])
else:
    from torch.distributed.run import main

    os.environ["ARRIVED_DIR"] = tempfile.mkdtemp(prefix="ddp-stuck-")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    extra = ["--mismatch"] if options.mismatch else []
    main(["--standalone", f"--nproc-per-node={options.ranks}", __file__, "--worker", *extra])
    sys.exit(0)
