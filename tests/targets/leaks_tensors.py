"""A torch training loop that leaks tensors the usual way, `history.append(out)`, with a heartbeat
that says how long the job was held still (as heavy_heartbeat.py does).

Each step's output (16 x 1024 float32: 64 KB, with its autograd graph) is kept in the global list
`history`, up to --keep steps; the job's largest tensor (8 MB) is held in
`trainer.cache['embeddings']`; all on --device (cpu, cuda). Training runs in a thread; a
heartbeat thread wakes every millisecond and keeps the longest gap between two wake-ups. Prints
`ready` once the first outputs are kept; each line on stdin is a question, answered `stall
SECONDS BEATS` (the longest gap and the beats since the last question). Exits when stdin closes.
"""

import argparse
import os
import sys
import threading
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps-per-s", type=float, default=50.0)
parser.add_argument("--keep", type=int, default=2000)
parser.add_argument("--device", default="cpu")
options = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)


class Trainer:
    def __init__(self) -> None:
        self.model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU()).to(options.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.cache = {
            "embeddings": torch.zeros(2048, 1024, device=options.device)
        }  # the job's largest tensor


trainer = Trainer()
history = []
first_steps = threading.Event()


def train() -> None:
    batch = torch.randn(16, 256, device=options.device)
    while True:
        out = trainer.model(batch)  # each step's output is made here
        if len(history) < options.keep:
            history.append(out)  # the leak
        loss = out.pow(2).mean()
        trainer.optimizer.zero_grad()
        loss.backward()
        trainer.optimizer.step()
        if len(history) >= 5:
            first_steps.set()
        time.sleep(1.0 / options.steps_per_s)


lock = threading.Lock()
longest = 0.0
beats = 0
beating = threading.Event()


def heartbeat() -> None:
    global longest, beats
    last = time.monotonic()
    beating.set()
    while True:
        time.sleep(0.001)
        now = time.monotonic()
        with lock:
            longest = max(longest, now - last)
            beats += 1
        last = now


threading.Thread(target=train, name="train", daemon=True).start()
threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
first_steps.wait()
beating.wait()
print("ready", os.getpid(), flush=True)
for _ in sys.stdin:
    with lock:
        answer = f"stall {longest:.6f} {beats}"
        longest = 0.0
        beats = 0
    print(answer, flush=True)
