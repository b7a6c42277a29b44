"""At rest: the main thread reads stdin inside main_loop(), a thread named "worker" waits
inside worker_loop(). "ready" once the worker waits. Exits when its stdin closes."""

import os
import sys
import threading


class BrokenRepr:
    def __repr__(self):
        raise RuntimeError("no repr for you")


stop = threading.Event()


def ratio(a, b):
    return a / b


def worker_loop(number):
    label = f"worker-{number}"  # noqa: F841 - a local for --locals
    stop.wait()


def main_loop():
    big = "x" * 100000  # noqa: F841
    broken = BrokenRepr()  # noqa: F841
    nested = {"a": [1, 2, {"b": list(range(100))}]}  # noqa: F841
    number = 42  # noqa: F841
    print("ready", os.getpid(), threading.get_ident(), flush=True)
    for _ in sys.stdin:
        pass
    stop.set()


def wait_until_inside(thread, function):
    """Return once `function` is the thread's innermost Python frame."""
    while True:
        frame = sys._current_frames().get(thread.ident)
        if frame is not None and frame.f_code.co_name == function:
            return
        threading.Event().wait(0.001)


worker = threading.Thread(target=worker_loop, args=(1,), name="worker", daemon=True)
worker.start()
wait_until_inside(worker, "wait")  # Condition.wait, under stop.wait()
main_loop()
