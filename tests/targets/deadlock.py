"""Two threads deadlocked on two locks; the main thread waits for them. "ready" once each
thread holds its lock and stands at the `with` of the other's."""

import sys
import threading
import time

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


def deadlocked():
    frames = sys._current_frames()
    inner = [frames.get(thread.ident) for thread in threads]
    return (
        first.locked()
        and second.locked()
        and all(
            frame is not None and frame.f_code.co_name == "take" and frame.f_lineno == WITH_THEIRS
            for frame in inner
        )
    )


WITH_THEIRS = take.__code__.co_firstlineno + 3
while not deadlocked():
    time.sleep(0.001)
print("ready", flush=True)
for thread in threads:
    thread.join()
