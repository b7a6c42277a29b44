"""A job with a thread that calls gc.collect() in a loop over a heap of a few hundred
thousand objects (each collection holds the GIL for milliseconds), while the main thread
steps: allocates, computes, and counts steps. Exits when its stdin closes."""

import gc
import os
import sys
import threading

heap = [{"step": i, "values": [i, i + 1]} for i in range(300_000)]
steps = 0
collections = 0
stop = threading.Event()


def collect_forever():
    global collections
    while not stop.is_set():
        gc.collect()
        collections += 1


def step_forever():
    global steps
    while not stop.is_set():
        batch = [{"n": n} for n in range(1000)]
        steps += len(batch) // 1000


threading.Thread(target=collect_forever, name="collector", daemon=True).start()
threading.Thread(target=step_forever, name="stepper", daemon=True).start()
while collections == 0 or steps == 0:  # ready once both loops run
    stop.wait(0.001)
print("ready", os.getpid(), flush=True)
for _ in sys.stdin:
    pass
stop.set()
