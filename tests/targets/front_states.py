"""Threads in many states at once, for comparing the native front end's output with the Python
CLI's: a lock, a `with` on a lock, a queue, an Event, a Condition, a Semaphore, a join, sleep,
socket recv, select, a pipe read and a child process wait. Prints "ready" once every thread sits
in its final frame (its stack no longer changes). Exits when its stdin closes."""

import os
import queue
import select
import socket
import subprocess
import sys
import threading
import time

held = threading.Lock()
held.acquire()
condition = threading.Condition()
semaphore = threading.Semaphore(0)
event = threading.Event()
jobs: "queue.Queue[int]" = queue.Queue()
left, right = socket.socketpair()
pipe_read, _pipe_write = os.pipe()
child = subprocess.Popen(["sleep", "3600"])


def on_lock():
    held.acquire()


def entering():
    with held:
        pass


def on_queue():
    jobs.get()


def on_event():
    event.wait()


def on_condition():
    with condition:
        condition.wait()


def on_semaphore():
    semaphore.acquire()


def sleeping():
    time.sleep(3600)


def on_socket():
    left.recv(1)


def on_select():
    select.select([right], [], [])


def on_pipe():
    os.read(pipe_read, 1)


def on_child():
    child.wait()


def joining():
    waiters[0].join()


# The innermost frame each thread's stack ends in once it waits.
WAITS = {
    on_lock: "on_lock", entering: "entering", on_queue: "wait", on_event: "wait", on_condition: "wait",
    on_semaphore: "wait", sleeping: "sleeping", on_socket: "on_socket", on_select: "on_select",
    on_pipe: "on_pipe", on_child: "_try_wait", joining: ("_wait_for_tstate_lock", "join"),
}  # fmt: skip
waiters = [threading.Thread(target=function, name=function.__name__, daemon=True) for function in WAITS]
for waiter in waiters:
    waiter.start()


def settled() -> bool:
    frames = sys._current_frames()
    for waiter, wanted in zip(waiters, WAITS.values()):
        frame = frames.get(waiter.ident)
        if frame is None or frame.f_code.co_name not in (wanted if isinstance(wanted, tuple) else (wanted,)):
            return False
    return True


while not settled():
    time.sleep(0.001)
print("ready", os.getpid(), flush=True)
for _ in sys.stdin:
    pass
child.kill()
