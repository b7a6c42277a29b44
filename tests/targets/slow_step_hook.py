"""A torch training loop whose own global optimizer pre-hook takes 1.5 s each step (a hook that
waits for a checkpoint writer, say): the training thread spends most of its time inside torch's
loop over the global optimizer hooks, where an edit of that dictionary from another thread
raises "OrderedDict mutated during iteration" in the job.

Prints "ready" after its first step and "step N" after each; any exception ends it with its
traceback on stderr and exit code 3.
"""

import os
import sys
import time
import traceback

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def wait_for_checkpoint_writer(optimizer: object, args: object, kwargs: object) -> None:
    time.sleep(1.5)


register_optimizer_step_pre_hook(wait_for_checkpoint_writer)

try:
    for step in range(10**9):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        os.write(1, b"ready\n" if step == 0 else f"step {step}\n".encode())
except BaseException:
    traceback.print_exc()
    sys.exit(3)
