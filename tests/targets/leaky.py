"""Pure Python that leaks: every tick keeps a record in a global list. Stops when stdin closes."""

import sys
import threading
import time

records = []
stop = threading.Event()


def watch_stdin():
    for _ in sys.stdin:
        pass
    stop.set()


def tick(step):
    records.append({"step": step, "payload": [step] * 500})  # the leak


threading.Thread(target=watch_stdin, daemon=True).start()
step = 0
while not stop.is_set():
    tick(step)
    step += 1
    if step == 5:
        print("ready", flush=True)
    time.sleep(0.01)
