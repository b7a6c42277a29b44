"""The main thread blocks in open() of a FIFO that no one opens for writing, on a `with open`
line; a second thread sleeps, so that attaching has a thread to borrow. The FIFO's path is
the first argument; "ready" comes just before the open (the test waits for the openat call).
"""

import sys
import threading

fifo = sys.argv[1]
threading.Thread(target=threading.Event().wait, name="idle", daemon=True).start()
print("ready", flush=True)
with open(fifo) as handle:
    handle.read()
