"""A training job whose loss turns NaN at step 30 and stays NaN.

    probing run -- python docs/examples/nan_loss.py

The model standardizes each batch of sensor readings before its MLP, dividing by the
per-feature standard deviation with no epsilon. From step 30 on, sensor 3 is dead (it
reads 0.0 in every sample), its standard deviation in every batch is 0, and 0 / 0 is NaN.
Nothing in the loop checks the loss, so the NaN reaches the weights and the job trains on
without learning anything. It prints "ready" after its first NaN loss and runs until you
stop it (Ctrl-C).
"""

import time

import torch
from torch import nn


class Standardize(nn.Module):
    """Scale every feature of the batch to mean 0 and standard deviation 1."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(dim=0)) / x.std(dim=0)  # the bug: no epsilon


def sensor_batches(batch_size: int = 32):
    """Readings of 8 sensors, and the quantity to predict from them."""
    generator = torch.Generator().manual_seed(0)
    step = 0
    while True:
        readings = torch.randn(batch_size, 8, generator=generator)
        if step >= 30:
            readings[:, 3] = 0.0  # sensor 3 died
        yield readings, readings[:, :2].sum(dim=1, keepdim=True)
        step += 1


def train() -> None:
    for step, (inputs, targets) in enumerate(sensor_batches()):
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
        if step == 30:
            print("ready", flush=True)
        time.sleep(0.02)


torch.manual_seed(0)
model = nn.Sequential(Standardize(), nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
train()
