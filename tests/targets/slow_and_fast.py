"""A thread that spends nearly all its time in `slow_function` and a sliver in
`fast_function`, in pure Python (the GIL taken, no system call). Prints `ready` once it has
run both; exits when its stdin closes.
"""

import sys
import threading


def slow_function():
    total = 0
    for number in range(300000):
        total += number
    return total


def fast_function():
    return sum(range(100))


def work():
    said = False
    while True:
        slow_function()
        fast_function()
        if not said:
            said = True
            print("ready", flush=True)


threading.Thread(target=work, name="worker", daemon=True).start()
for _ in sys.stdin:
    pass
