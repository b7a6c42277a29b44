"""Reads every thread's stack in a loop the way the agent does (agent/stacks.py thread_stacks),
in a process set up to deadlock CPython up to 3.11 inside sys._current_frames() (gh-106883):
every allocation starts a collection (threshold 1), every collection runs a finalizer that lets
the GIL go (and leaves the next collection one of its own), four threads sit in frames that have
no frame object yet, and a thread starts and ends threads without pause. Prints `alive N` after
SECONDS of it (N reads); a process that deadlocked prints nothing.

    python frames_trap.py SECONDS
"""

import gc
import sys
import threading
import time

from probing.agent.stacks import thread_stacks


class Trap:
    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        Trap()  # the next collection has one again
        time.sleep(0.0005)  # lets the GIL go, as any Python code run by a collection may


def threads_that_end() -> None:
    while True:
        ending = threading.Thread(target=int)
        ending.start()
        ending.join()


def parked() -> None:
    def deeper() -> None:  # a frame that gets a frame object only when someone asks for one
        threading.Event().wait()

    deeper()


for _ in range(4):
    threading.Thread(target=parked, daemon=True).start()
threading.Thread(target=threads_that_end, daemon=True).start()
Trap()
gc.set_threshold(1)
deadline = time.monotonic() + float(sys.argv[1])
reads = 0
while time.monotonic() < deadline:
    thread_stacks(set())
    reads += 1
print("alive", reads, flush=True)
