"""A job whose main loop counts `step`, a global of its __main__, every few milliseconds; it
also has a `model`. Exits when its stdin closes."""

import os
import sys
import threading
import time

step = 0
model = "the job's model"
stop = threading.Event()


def watch_stdin():
    for _ in sys.stdin:
        pass
    stop.set()


threading.Thread(target=watch_stdin, name="stdin-watcher", daemon=True).start()
while not stop.is_set():
    step += 1
    if step == 1:
        print("ready", os.getpid(), flush=True)  # from inside the loop: step counts
    time.sleep(0.005)
