"""A training loop whose `loss` (and a payload, tracked in `alive`) are locals of a per-step
function: train_step(i) sets them, sets `step_taken`, and waits for `advance` before it
returns. Prints `ready` once step 0 holds them; exits when stdin closes."""

import sys
import threading
import weakref

step_taken = threading.Event()
advance = threading.Event()
alive: "weakref.WeakSet[Payload]" = weakref.WeakSet()


class Payload:
    """Stands for a step's activations."""


def train_step(step: int) -> None:
    loss = float(step)
    payload = Payload()
    alive.add(payload)
    if step == 0:
        print("ready", flush=True)
    step_taken.set()
    advance.wait()
    advance.clear()
    del payload, loss


def train() -> None:
    step = 0
    while True:
        train_step(step)
        step += 1


threading.Thread(target=lambda: (sys.stdin.read(), advance.set()), daemon=True).start()
train()
