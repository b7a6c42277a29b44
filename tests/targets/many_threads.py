"""200 threads waiting on one event, and the main thread reading stdin."""

import sys
import threading

stop = threading.Event()
for number in range(200):
    threading.Thread(target=stop.wait, name=f"waiter-{number}", daemon=True).start()
print("ready", flush=True)
for _ in sys.stdin:
    pass
stop.set()
