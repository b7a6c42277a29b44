"""A torch job holding many live Python objects, for benchmarks/bench_memory.py.

    memory_target.py OBJECTS [heartbeat]

Builds a small model and OBJECTS live objects (small lists, one per object, in a global
list), prints "ready", then waits for stdin to close. With `heartbeat`, a thread sleeps 1 ms at a
time and records how long it was held still (see heartbeat_target.py); `longest_gap()` and
`reset()` are called through `probing eval`.
"""

import sys
import threading
import time

import torch

model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
objects = [[index] for index in range(int(sys.argv[1]))]
gaps = []


def beat():
    last = time.perf_counter()
    while True:
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        if len(gaps) > 100000:
            del gaps[:50000]
        last = now


def reset():
    gaps.clear()


def longest_gap():
    return max(gaps, default=0.0)


if "heartbeat" in sys.argv[2:]:
    threading.Thread(target=beat, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
