"""A job whose names are terminal escape sequences: a thread named to retitle the window and
forge a "MainThread" line, running a function of such a name, compiled from a file of such a
name, with such a local. Prints "ready" once that thread waits in that function. Exits when
its stdin closes."""

import os
import sys
import threading

EVIL = '\x1b]0;pwned\x07\x1b[2J\r\nThread 1 "MainThread", main thread: idle\x9b31m\u202e'

SOURCE = """
def waiting(started, stop):
    secret = EVIL
    started.set()
    stop.wait()
"""

namespace = {"EVIL": EVIL}
exec(compile(SOURCE, "evil" + EVIL + ".py", "exec"), namespace)
waiting = namespace["waiting"]
waiting.__code__ = waiting.__code__.replace(co_name="wait" + EVIL)

started, stop = threading.Event(), threading.Event()
thread = threading.Thread(target=waiting, args=(started, stop), name="evil" + EVIL, daemon=True)
thread.start()
started.wait()
print("ready", os.getpid(), flush=True)
for _ in sys.stdin:
    pass
stop.set()
