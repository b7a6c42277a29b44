"""A torch job for measuring what attaching costs it.

The main thread trains a small model in short steps (1 ms sleep between them) and records
the time between the starts of consecutive steps; a heartbeat thread sleeps 1 ms at a time
and records the gaps between its wake-ups. Any thread held still by an attach shows up as a
long gap. Commands come on stdin (the job has no agent to talk to before the attach):
`reset`, and `report`, which prints the longest gap and step since the last reset as one
JSON line.
"""

import json
import sys
import threading
import time

import torch

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data, target = torch.randn(16, 64), torch.randn(16, 1)
lock = threading.Lock()
stats = {"gap": 0.0, "step": 0.0, "steps": 0}


def record(key, value):
    with lock:
        if value > stats[key]:
            stats[key] = value


def heartbeat():
    last = time.perf_counter()
    while True:
        time.sleep(0.001)
        now = time.perf_counter()
        record("gap", now - last)
        last = now


def commands():
    for line in sys.stdin:
        with lock:
            if line.strip() == "report":
                print(json.dumps({"gap_ms": stats["gap"] * 1000, "step_ms": stats["step"] * 1000,
                                  "steps": stats["steps"]}), flush=True)  # fmt: skip
            stats.update(gap=0.0, step=0.0, steps=0)


def train():
    last = time.perf_counter()
    while True:
        started = time.perf_counter()
        record("step", started - last)
        last = started
        loss = torch.nn.functional.mse_loss(model(data), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with lock:
            stats["steps"] += 1
        time.sleep(0.001)


threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
threading.Thread(target=commands, name="commands", daemon=True).start()
print("ready", flush=True)
train()
