"""Crashes in a called Python function: train() calls read_null() at step 3, which reads address
0 through ctypes (SIGSEGV), while a thread named "helper" waits on an Event in wait_for_stop().
It crashes only once the helper waits, so a core written by the kernel (`ulimit -c`) holds both
stacks as the tests expect them."""

import ctypes
import sys
import threading


def read_null(step):
    return ctypes.string_at(0)


def train(steps):
    for step in range(steps):
        if step == 3:
            read_null(step)


def wait_for_stop(stop):
    stop.wait()


def wait_until_inside(thread, function):
    """Return once `function` is the thread's innermost Python frame."""
    while True:
        frame = sys._current_frames().get(thread.ident)
        if frame is not None and frame.f_code.co_name == function:
            return
        threading.Event().wait(0.001)


stop = threading.Event()
helper = threading.Thread(target=wait_for_stop, args=(stop,), name="helper", daemon=True)
helper.start()
wait_until_inside(helper, "wait")  # Condition.wait, under stop.wait()
train(10)
