"""A torch training loop that leaks: every step's output tensor is kept in a global list.

Prints "ready" after its first steps; `--steps-per-s N` paces it. Stops when stdin closes.
"""

import argparse
import os
import sys
import tempfile
import threading
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps-per-s", type=float, default=50.0)
arguments = parser.parse_args()

torch.manual_seed(0)
device = os.environ.get("LEAKY_DEVICE", "cpu")
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).to(
    device
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
kept_outputs = []
# In the temporary directory, never the source tree; process.stats lists it among the open files.
log = open(os.path.join(tempfile.gettempdir(), f"leaky_job-{os.getpid()}.log"), "w")  # noqa: SIM115
stop = threading.Event()


def watch_stdin():
    for _ in sys.stdin:
        pass
    stop.set()


def train():
    batch = torch.randn(64, 256, device=device)
    step = 0
    while not stop.is_set():
        output = model(batch)  # each step's output is allocated here
        kept_outputs.append(output)  # the leak: 64 KB of tensor (and its graph) per step
        loss = output.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == 5:
            print("ready", flush=True)
        time.sleep(1.0 / arguments.steps_per_s)


threading.Thread(target=watch_stdin, daemon=True).start()
train()
log.close()
