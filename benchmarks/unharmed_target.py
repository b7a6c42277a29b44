"""The job bench_unharmed.py probes: a small model trained as fast as the CPU goes, with a
heartbeat thread that measures how long the job's threads were kept from running.

    PROBING=1 python benchmarks/unharmed_target.py LOGDIR [--blocks N]
    PROBING=1 torchrun --standalone --nproc-per-node=4 benchmarks/unharmed_target.py LOGDIR --distributed

Each rank writes two logs into LOGDIR:
- `steps-RANK.log`: `<time> <seconds since the previous step ended>` per optimizer step;
- `beats-RANK.log`: `<time> <gap>` for each wake-up of the heartbeat more than 2 ms after the one
  before. The heartbeat sleeps 1 ms at a time, so a gap of G means that for about G - 1 ms it
  could not run: some thread held the GIL (the switch interval is 5 ms, so only a long C call
  holds it longer than that), or the machine gave it no CPU.

With --distributed (gloo, under torchrun) the model is wrapped in DistributedDataParallel with
small buckets, so that every step makes several all_reduces and the Flight Recorder's ring
(TORCH_FR_BUFFER_SIZE, 2000 by default) is full by the time the rank says ready. A rank prints
`ready RANK PID` once warmed up (and, distributed, once its ring is full).
"""

import argparse
import os
import sys
import threading
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("logdir")
parser.add_argument("--blocks", type=int, default=100, help="Linear+ReLU blocks in the model")
parser.add_argument("--width", type=int, default=8)
parser.add_argument("--distributed", action="store_true")
options = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
rank = 0
if options.distributed:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
width = options.width
blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(options.blocks)]
model: nn.Module = nn.Sequential(*blocks)
if options.distributed:
    # Buckets of about a layer each: several all_reduces a step fill the Flight Recorder quickly.
    bucket_mb = 4 * width * (width + 1) / 1e6
    model = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
data, target = torch.randn(4, options.width), torch.randn(4, options.width)

late: list = []  # lines the heartbeat has yet to write


def heartbeat() -> None:
    with open(os.path.join(options.logdir, f"beats-{rank}.log"), "w") as log:
        last = flushed = time.perf_counter()
        while True:
            time.sleep(0.001)
            now = time.perf_counter()
            if now - last > 0.002:
                late.append(f"{time.time():.6f} {now - last:.6f}\n")
            if now - flushed > 0.1 and late:
                lines = late[:]
                del late[: len(lines)]
                log.write("".join(lines))
                log.flush()
                flushed = now
            last = now


threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()


def collectives_recorded() -> int:
    if not options.distributed:
        return 0
    import pickle

    dump = torch._C._distributed_c10d._dump_fr_trace  # type: ignore[attr-defined]
    raw = dump(includeCollectives=True, includeStackTraces=False)
    return len(pickle.loads(raw).get("entries") or ())


ready_after = 200
with open(os.path.join(options.logdir, f"steps-{rank}.log"), "w", buffering=1 << 16) as steps:
    previous = time.perf_counter()
    step = 0
    while True:
        loss = nn.functional.mse_loss(model(data), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        now = time.perf_counter()
        steps.write(f"{time.time():.6f} {now - previous:.6f}\n")
        steps.flush()
        previous = now
        step += 1
        if step == ready_after:
            ring = int(os.environ.get("TORCH_FR_BUFFER_SIZE", "2000"))
            if options.distributed and collectives_recorded() < ring:
                ready_after += 100
            else:
                os.write(1, f"ready {rank} {os.getpid()}\n".encode())
                sys.stdout.flush()
            previous = time.perf_counter()
