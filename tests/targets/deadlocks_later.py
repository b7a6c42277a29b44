"""Works (its main thread's stack keeps changing) for a second, then deadlocks on a lock."""

import random
import threading
import time

started_working = threading.Event()


def load():
    time.sleep(0.02)


def step():
    time.sleep(0.03)


def log():
    time.sleep(0.01)


started = time.monotonic()
while time.monotonic() - started < 1.0:
    random.choice((load, step, log))()
    if not started_working.is_set():
        started_working.set()
        print("ready", flush=True)  # from inside the working loop
lock = threading.Lock()
lock.acquire()
lock.acquire()  # never returns
