"""Rank RANK of a two-process gloo job (TCP store on PORT) whose rank 0 times out in an
all_reduce that rank 1 never joins: `python gloo_timeout.py RANK PORT`.

Both print `joined` once the process group is up; rank 1 then waits for stdin to close, rank 0
calls all_reduce with a 2 s timeout and dies of gloo's "Timed out waiting 2000ms for recv".
"""

import datetime
import sys

import torch
import torch.distributed as dist

rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group(
    "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
    timeout=datetime.timedelta(seconds=2),
)  # fmt: skip
print("joined", flush=True)


def reduce_gradients(tensor):  # type: ignore[no-untyped-def]
    dist.all_reduce(tensor)


if rank == 0:
    reduce_gradients(torch.ones(4))
else:
    sys.stdin.read()
