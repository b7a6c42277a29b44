"""A job stuck because one of its threads holds the GIL inside a C call that never returns.

    python docs/examples/held_gil.py

Some C extensions call a blocking function without releasing the GIL; while it blocks, no
other thread of the process can run Python: not the training loop, not a debugger's agent.
Here the "uploader" thread calls libc's sleep() through ctypes.PyDLL, which keeps the GIL
during the call, to stand for such an extension. It prints "ready" just before, and runs
until it is killed (Ctrl-C cannot stop it: the signal handler needs the GIL too).
"""

import ctypes
import threading
import time


def upload_metrics() -> None:
    extension = ctypes.PyDLL(None)  # PyDLL keeps the GIL held during calls into the library
    time.sleep(1.0)  # the first upload, a second after the start
    print("ready", flush=True)
    extension.sleep(3600)  # a C call that blocks for an hour, holding the GIL


def train() -> None:
    step = 0
    while True:
        time.sleep(0.3)  # stands for a step in torch, which releases the GIL while it computes
        step += 1


threading.Thread(target=upload_metrics, name="uploader", daemon=True).start()
train()
