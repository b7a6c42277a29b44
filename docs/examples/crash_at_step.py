"""A training job that dies at a given step: the loss turns NaN and the job raises, as a job that
checks its loss does. The user guide's post-mortem reads the record it leaves.

    PROBING=1 PROBING_TORCH_TRACE=1 python docs/examples/crash_at_step.py --crash-at 40
"""

import argparse
import math
import time

import torch
from torch import nn

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--crash-at", type=int, default=40)
parser.add_argument("--pause", type=float, default=0.02, help="seconds to sleep after each step")
options = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
activations = []  # what a leaky job keeps: memory grows step by step


def check(loss: torch.Tensor, step: int) -> None:
    if step == options.crash_at:
        loss = loss * float("nan")
    if not math.isfinite(loss.item()):
        raise FloatingPointError(f"loss is {loss.item()} at step {step}")


def train() -> None:
    for step in range(10**9):
        inputs = torch.randn(512, 32)
        loss = nn.functional.mse_loss(model(inputs), inputs[:, :1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        activations.append(torch.randn(256, 1024))
        check(loss, step)
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(options.pause)


train()
