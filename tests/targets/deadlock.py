"""Two threads deadlocked on two locks; the main thread waits for them."""

import threading

first, second = threading.Lock(), threading.Lock()
both_hold_one = threading.Barrier(2)


def take(mine, theirs):
    with mine:
        both_hold_one.wait()
        with theirs:
            pass


threads = [
    threading.Thread(target=take, args=(first, second), name="takes-first"),
    threading.Thread(target=take, args=(second, first), name="takes-second"),
]
for thread in threads:
    thread.start()
print("ready", flush=True)
for thread in threads:
    thread.join()
