"""A job that takes commands on stdin: `hold` starts a thread that holds the GIL inside a C call
for an hour (as gil_holder.py's does), announced by `holding` through write(2); on stdin's end it
exits. "ready" at once. Stdlib only."""

import ctypes
import sys
import threading


def hold_the_gil():
    sys.setswitchinterval(1000.0)
    libc = ctypes.PyDLL(None)
    libc.write(1, b"holding\n", 8)
    libc.sleep(3600)


print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "hold":
        threading.Thread(target=hold_the_gil, name="gil-holder", daemon=True).start()
