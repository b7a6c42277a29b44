"""A job that closes every descriptor above 2 when told to (a line `close` on stdin), as a
job does before it daemonizes or execs; it prints "closed" once they are closed. A thread
named "worker" waits meanwhile. Exits when its stdin closes."""

import os
import sys
import threading

stop = threading.Event()


def worker_loop():
    stop.wait()


threading.Thread(target=worker_loop, name="worker", daemon=True).start()
print("ready", os.getpid(), flush=True)
for line in sys.stdin:
    if line.strip() == "close":
        os.closerange(3, 1000)
        print("closed", flush=True)
stop.set()
