"""Several threads at rest, each in a function of its own: load_batches(), save_checkpoints()
and send_heartbeats() wait on one Event, the main thread reads stdin in serve(). "ready" once
the three wait. Exits when its stdin closes."""

import os
import sys
import threading

stop = threading.Event()


def load_batches():
    batch = 7  # noqa: F841 - a local for --locals
    stop.wait()


def save_checkpoints():
    stop.wait()


def send_heartbeats():
    stop.wait()


def wait_until_inside(thread, function):
    while True:
        frame = sys._current_frames().get(thread.ident)
        if frame is not None and frame.f_code.co_name == function:
            return
        threading.Event().wait(0.001)


def serve():
    print("ready", os.getpid(), flush=True)
    for _ in sys.stdin:
        pass
    stop.set()


threads = [threading.Thread(target=function, name=function.__name__, daemon=True)
           for function in (load_batches, save_checkpoints, send_heartbeats)]  # fmt: skip
for thread in threads:
    thread.start()
for thread in threads:
    wait_until_inside(thread, "wait")
serve()
