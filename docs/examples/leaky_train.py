"""A training job whose memory grows: it keeps every batch's predictions for an end-of-epoch
metric, and its epochs never end. The user guide's memory-growth section finds the line.

    probing run -- python docs/examples/leaky_train.py
"""

import sys
import threading
import time

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 128))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
predictions = []  # for the epoch's metric
stop = threading.Event()


def watch_stdin() -> None:
    for _ in sys.stdin:
        pass
    stop.set()


def train() -> None:
    inputs, targets = torch.randn(256, 128), torch.randn(256, 128)
    step = 0
    while not stop.is_set():
        outputs = model(inputs)
        loss = nn.functional.mse_loss(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        predictions.append(outputs)  # kept until the epoch ends, with its autograd graph
        step += 1
        if step == 5:
            print("ready", flush=True)
        time.sleep(0.02)


threading.Thread(target=watch_stdin, daemon=True).start()
train()
