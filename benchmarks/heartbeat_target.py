"""A job whose heartbeat thread measures how long it is held still.

The heartbeat sleeps 1 ms at a time and records the time between its wake-ups; any gap
well over 1 ms is time the thread could not run (the GIL held by someone, the process
stopped). `reset()` and `report()` are called through `probing eval`. With the argument
`busy`, the main thread runs a pure-Python loop, as a training step's Python side does.
"""

import json
import sys
import threading
import time

gaps = []
lock = threading.Lock()


def beat():
    last = time.perf_counter()
    while True:
        time.sleep(0.001)
        now = time.perf_counter()
        with lock:
            gaps.append(now - last)
            if len(gaps) > 200000:
                del gaps[:100000]
        last = now


def reset():
    with lock:
        del gaps[:]


def report():
    with lock:
        ordered = sorted(gaps)
    if not ordered:
        return json.dumps({"max_ms": 0.0, "p99_ms": 0.0, "beats": 0})
    return json.dumps(
        {
            "max_ms": ordered[-1] * 1000,
            "p99_ms": ordered[int(len(ordered) * 0.99)] * 1000,
            "beats": len(ordered),
        }
    )


threading.Thread(target=beat, name="heartbeat", daemon=True).start()
print("ready", flush=True)
if sys.argv[1:] == ["busy"]:
    total = 0
    while True:
        for i in range(10000):
            total += i * i
else:
    for _ in sys.stdin:
        pass
