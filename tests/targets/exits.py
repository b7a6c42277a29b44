"""Exits with the status given on its command line, or on SIGTERM with status 0 after
saying so (a job that checkpoints when asked to stop)."""

import signal
import sys
import threading

stop = threading.Event()


def on_term(signum, frame):
    print("got SIGTERM", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
if sys.argv[1:] == ["wait"]:
    while not stop.wait(0.05):
        pass
sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1] != "wait" else 0)
