"""A job whose steps are a little pure-Python work each, timed: every step prints
`step START_MONOTONIC SECONDS` (CLOCK_MONOTONIC is the machine's, so a test can line steps up
with what it did meanwhile). Ready after a few steps; exits when its stdin closes. --fork also
forks a child (a DataLoader worker, say) that lives until stdin closes, even if the job dies.
--long-steps makes each step's work last longer than the GIL's switch interval (5 ms), so a
sampler inside the job finds the step in `work`, not only where it sleeps."""

import os
import sys
import threading
import time

stop = threading.Event()


def watch_stdin():
    for _ in sys.stdin:
        pass
    stop.set()


ITERATIONS = 400000 if "--long-steps" in sys.argv else 100000


def work():
    return sum(i * i for i in range(ITERATIONS))


threading.Thread(target=watch_stdin, name="stdin-watcher", daemon=True).start()
child = 0
if "--fork" in sys.argv:
    child = os.fork()
    if child == 0:
        for _ in sys.stdin:
            pass
        os._exit(0)
step = 0
while not stop.is_set():
    step += 1
    started = time.monotonic()
    work()
    took = time.monotonic() - started
    print(f"step {started:.6f} {took:.6f}", flush=True)
    if step == 5:
        print("ready", os.getpid(), f"child={child}", flush=True)
    time.sleep(0.003)
