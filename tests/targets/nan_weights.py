"""A torch training loop whose model.2 weights turn NaN at a chosen step (a bad write: a
checkpoint reloaded wrong, a corrupted update), for the tests of NaN blame after the fact.

    --nan-weight-at K  before step K, one value of model.2's weight becomes NaN
    --gate             with --nan-weight-at: once it is NaN, say ready and wait for a "go" line
                       on stdin before training on (the optimizer has not spread it yet)
    --ready-at N       without --gate: say ready once step N is done (default 1)
    --steps N          stop training after N steps, then idle until stdin closes

The model is Linear, ReLU, Linear, Tanh, Linear (model.0 ... model.4). After step K's update the
NaN has spread: every weight the loss's gradient reaches is NaN. Prints `done` after the last
step; exits when stdin closes.
"""

import argparse
import sys
import threading
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--nan-weight-at", type=int, default=-1)
parser.add_argument("--gate", action="store_true")
parser.add_argument("--ready-at", type=int, default=1)
parser.add_argument("--steps", type=int, default=10**9)
options = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.MSELoss()
go = threading.Event()
stop = threading.Event()


def watch_stdin() -> None:
    for line in sys.stdin:
        if line.strip() == "go":
            go.set()
    stop.set()
    go.set()


def train() -> None:
    generator = torch.Generator().manual_seed(1)
    step = 0
    while step < options.steps and not stop.is_set():
        if step == options.nan_weight_at:
            with torch.no_grad():
                model[2].weight[0, 0] = float("nan")
            if options.gate:
                print("ready", flush=True)  # model.2's weight is NaN, every other weight finite
                go.wait()
        optimizer.zero_grad()
        data = torch.randn(32, 8, generator=generator)
        target = torch.randn(32, 4, generator=generator)
        loss_fn(model(data), target).backward()
        optimizer.step()
        step += 1
        if step == options.ready_at and not options.gate:
            print("ready", flush=True)
        time.sleep(0.005)
    print("done", flush=True)


threading.Thread(target=watch_stdin, daemon=True).start()
train()
stop.wait()
