"""A seeded torch training loop with knobs for the torch tests.

    --slow             model.2 sleeps 20 ms in every forward (the slow submodule)
    --poison forward   model.2 outputs NaN from its --poison-at'th call on
    --poison backward  model.2's input gradient is NaN from its --poison-at'th call on
    --accumulate K     K micro-batches (forward + backward) per optimizer step
    --two-optimizers   model.0 and the rest trained by two optimizers, stepped one after the other
    --gate             say ready, then wait for a "go" line on stdin before training
    --steps N          stop training after N steps, then idle until stdin closes

Prints `ready` once its first step is done (with --gate: once it waits for "go"), and
`loss <step> <float.hex>` per step with --print-losses, `stopped ...` if
NonFiniteError stops it (its checkpoint-and-exit path, then `weights finite: <bool>`), and
`done` after the last step. Exits
when stdin closes.
"""

import argparse
import sys
import threading
import time

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--slow", action="store_true")
parser.add_argument("--poison", choices=("none", "forward", "backward"), default="none")
parser.add_argument("--poison-at", type=int, default=30)
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--two-optimizers", action="store_true")
parser.add_argument("--gate", action="store_true")
parser.add_argument("--steps", type=int, default=10**9)
parser.add_argument("--pause", type=float, default=0.005)
parser.add_argument("--print-losses", action="store_true")
parser.add_argument("--device", default="cpu")
options = parser.parse_args()


class NanGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad * float("nan")


class Middle(nn.Module):
    """The middle layer: slow, or poisoned, or a plain Tanh."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if options.slow:
            time.sleep(0.02)
        poisoned = self.calls >= options.poison_at
        if options.poison == "forward" and poisoned:
            return torch.tanh(x) * float("nan")
        if options.poison == "backward" and poisoned:
            return NanGrad.apply(torch.tanh(x))
        return torch.tanh(x)


# One intra-op thread: on a loaded machine, a pool of them waiting for CPUs made each tiny
# Linear take ms (model.3 outran the 20 ms --slow module in the report test).
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Middle(), nn.Linear(16, 4)).to(options.device)
loss_fn = nn.MSELoss()
if options.two_optimizers:
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.01, momentum=0.9)
    head_optimizer = torch.optim.AdamW(model[3].parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
    optimizers = [optimizer, head_optimizer]
else:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
    optimizers = [optimizer]
marker = torch.zeros(123, 45)  # a tensor python.tensors must find
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
        for optimizer_ in optimizers:
            optimizer_.zero_grad()
        try:
            for _ in range(options.accumulate):
                data = torch.randn(32, 8, generator=generator).to(options.device)
                target = torch.randn(32, 4, generator=generator).to(options.device)
                loss = loss_fn(model(data), target)
                loss.backward()
            for optimizer_ in optimizers:
                optimizer_.step()
        except FloatingPointError as error:  # NonFiniteError from `probing PID nan on --stop`
            print(f"stopped at step {step}: checkpoint saved; {type(error).__name__}: {error}", flush=True)
            finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
            print(f"weights finite: {finite}", flush=True)  # the update that would write NaN did not run
            return
        if options.print_losses:
            print(f"loss {step} {loss.item().hex()}", flush=True)
        step += 1
        if step == 1 and not options.gate:
            print("ready", flush=True)  # the training loop runs
        time.sleep(options.pause)
    print("done", flush=True)


threading.Thread(target=watch_stdin, daemon=True).start()
if options.gate:
    print("ready", flush=True)
    go.wait()
train()
stop.wait()
