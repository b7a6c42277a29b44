"""A job that survives SIGHUP: its own handler "reloads" and prints `reloaded N`, as a server
does for log rotation. Prints `ready` once the handler is set; ends when stdin closes."""

import signal
import sys

reloads = 0


def on_sighup(signum, frame):  # type: ignore[no-untyped-def]
    global reloads
    reloads += 1
    print(f"reloaded {reloads}", flush=True)


signal.signal(signal.SIGHUP, on_sighup)
print("ready", flush=True)
for _ in sys.stdin:
    pass
