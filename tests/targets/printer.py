"""A thread prints "tick N" every few milliseconds to the job's own stdout, as a training
loop logs; the main thread waits for stdin to close."""

import sys
import threading
import time

done = threading.Event()


def tick():
    number = 0
    while not done.is_set():
        print("tick", number, flush=True)
        number += 1
        time.sleep(0.002)


print("ready", flush=True)
threading.Thread(target=tick, name="ticker", daemon=True).start()
for _ in sys.stdin:
    pass
done.set()
