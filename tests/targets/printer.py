"""A thread prints "tick N" every few milliseconds to the job's own stdout, as a training
loop logs; the main thread waits for stdin to close. "ready" once the ticks have started."""

import sys
import threading
import time

done = threading.Event()
ticking = threading.Event()


def tick():
    number = 0
    while not done.is_set():
        print("tick", number, flush=True)
        ticking.set()
        number += 1
        time.sleep(0.002)


threading.Thread(target=tick, name="ticker", daemon=True).start()
ticking.wait()
print("ready", flush=True)
for _ in sys.stdin:
    pass
done.set()
