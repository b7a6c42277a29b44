"""The training job the debugging guide (../shared/seeds/probing-debugging-guide.md) assumes.

`model` and `optimizer` are globals; `trainer` (with `current_step` and `last_loss`) and the
DataLoader `train_loader` are locals of main() and train(); `loss` is a local of train() only,
as in real training code. CPU torch, a tiny model. Prints `ready` once it has taken a step
(so `loss` exists), then trains until stdin closes.
"""

import sys
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
stop = threading.Event()


class Trainer:
    def __init__(self) -> None:
        self.current_step = 0
        self.last_loss = float("nan")


def watch_stdin() -> None:
    for _ in sys.stdin:
        pass
    stop.set()


def train(trainer: Trainer, train_loader: DataLoader) -> None:  # type: ignore[type-arg]
    while not stop.is_set():
        for inputs, targets in train_loader:
            loss = nn.functional.mse_loss(model(inputs), targets)
            # Gradients zeroed in place, not dropped: the guide's "Inspect Variables" prints
            # `grad=True` for every parameter, and an eval landing between zero_grad() (which sets
            # them to None by default) and backward() saw grad=False (once in CI, under load).
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            optimizer.step()
            trainer.current_step += 1
            trainer.last_loss = loss.item()
            if trainer.current_step == 1:
                print("ready", flush=True)
            if stop.is_set():
                return
            time.sleep(0.005)


def main() -> None:
    train_loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=16)
    trainer = Trainer()
    train(trainer, train_loader)


threading.Thread(target=watch_stdin, name="stdin-watcher", daemon=True).start()
main()
