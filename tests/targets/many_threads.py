"""200 threads waiting on one event, and the main thread reading stdin. "ready" once all 200
wait."""

import sys
import threading
import time

stop = threading.Event()
waiters = [threading.Thread(target=stop.wait, name=f"waiter-{number}", daemon=True) for number in range(200)]
for waiter in waiters:
    waiter.start()
frames = sys._current_frames()
while not all(waiter.ident in frames and frames[waiter.ident].f_code.co_name == "wait" for waiter in waiters):
    time.sleep(0.001)
    frames = sys._current_frames()
del frames
print("ready", flush=True)
for _ in sys.stdin:
    pass
stop.set()
