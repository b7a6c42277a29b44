"""A small torch training loop; `loss` is a local of train(). Stops when stdin closes."""

import sys
import threading
import time

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
stop = threading.Event()


def watch_stdin():
    for _ in sys.stdin:
        pass
    stop.set()


def train():
    data, target = torch.randn(32, 8), torch.randn(32, 1)
    step = 0
    while not stop.is_set():
        loss = torch.nn.functional.mse_loss(model(data), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == 1:
            print("ready", flush=True)
        time.sleep(0.005)


threading.Thread(target=watch_stdin, name="stdin-watcher", daemon=True).start()
train()
