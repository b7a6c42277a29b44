"""A job that is expensive to look at, with a heartbeat that says how long it was held still.

    --objects N       keep N small objects gc tracks (instances of a slotted class)
    --collectives N   import torch, make a one-rank gloo group and run N all_reduces first, so
                      that its Flight Recorder holds N entries (set TORCH_FR_BUFFER_SIZE >= N)

A heartbeat thread wakes every millisecond and keeps the longest gap between two wake-ups (how
long the job was held still: the GIL held by another thread, or no CPU). Each line on stdin is a
question: the job prints `stall SECONDS BEATS` (the longest gap and the number of beats since
the last question) and starts measuring afresh. Prints `ready` once the state exists and the
heartbeat runs; exits when stdin closes.
"""

import argparse
import gc
import os
import socket
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--objects", type=int, default=0)
parser.add_argument("--collectives", type=int, default=0)
options = parser.parse_args()


class Leaf:
    __slots__ = ()


kept = [Leaf() for _ in range(options.objects)]

if options.collectives:
    import torch
    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    weights = torch.ones(16)
    for _ in range(options.collectives):
        dist.all_reduce(weights)

# The garbage of making that state is collected now: a collection it made due would otherwise
# fall in the first command's window, whoever's allocation set it off.
gc.collect()
lock = threading.Lock()
longest = 0.0
beats = 0
started = threading.Event()


def heartbeat() -> None:
    global longest, beats
    last = time.monotonic()
    started.set()
    while True:
        time.sleep(0.001)
        now = time.monotonic()
        with lock:
            longest = max(longest, now - last)
            beats += 1
        last = now


threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
started.wait()
print("ready", os.getpid(), flush=True)
for _ in sys.stdin:
    with lock:
        answer = f"stall {longest:.6f} {beats}"
        longest = 0.0
        beats = 0
    print(answer, flush=True)
