"""A small training job to try probing on: an MLP on synthetic data, fed by a DataLoader.

    probing run -- python docs/examples/train.py

It trains until stopped (or for --steps steps). The names the user guide's commands use are
here: `model`, `optimizer`, `train_loader`, `trainer.current_step`, `trainer.last_loss`, and
`loss`, a local of train().
"""

import argparse
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self) -> None:
        self.current_step = 0
        self.last_loss = float("nan")


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def checkpoint_every(seconds: float, stop: threading.Event) -> None:
    while not stop.wait(seconds):
        pass  # a real job would save model.state_dict() here


def train(steps: int, pause: float) -> None:
    while trainer.current_step < steps:
        for inputs, targets in train_loader:
            loss = nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            trainer.current_step += 1
            trainer.last_loss = loss.item()
            if trainer.current_step == 1:
                print("ready", flush=True)
            time.sleep(pause)  # leave the CPU to whoever is watching
            if trainer.current_step >= steps:
                return


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=10**9)
parser.add_argument("--pause", type=float, default=0.02, help="seconds to sleep after each step")
options = parser.parse_args()

torch.manual_seed(0)
features = torch.randn(4096, 32)
labels = features[:, :1] * 2.0 + 0.1 * torch.randn(4096, 1)
train_loader = DataLoader(TensorDataset(features, labels), batch_size=64, shuffle=True)
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
trainer = Trainer()
stop = threading.Event()
threading.Thread(target=checkpoint_every, args=(60.0, stop), name="checkpointer", daemon=True).start()
try:
    train(options.steps, options.pause)
finally:
    stop.set()
