"""A multiprocessing.Pool parent at rest: its main thread waits on the pool (`map`: the result
of a map over tasks that never end; `apply`: one apply_async(...).get()), its pool threads
(_handle_workers, _handle_tasks, _handle_results) wait too, and no thread of it holds the GIL
for longer than a moment. "ready PID" once a worker runs its task. Stdlib only.

Each worker dies with the parent (PR_SET_PDEATHSIG): a test kills the parent's children first,
and the pool starts new ones before the parent itself is killed, which would outlive it."""

import ctypes
import multiprocessing
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
started = None


def remember(event, parent):
    global started
    started = event
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(0)


def never_ends(number):
    started.set()
    time.sleep(3600)
    return number


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "map"
    # Forked workers, as 3.8-3.13 start them by default: from 3.14 on the default is forkserver,
    # whose workers are the server's children, not this parent's.
    context = multiprocessing.get_context("fork")
    running = context.Event()
    with context.Pool(4, initializer=remember, initargs=(running, os.getpid())) as pool:
        if mode == "map":
            pending = pool.map_async(never_ends, range(8), chunksize=1)
        else:
            pending = pool.apply_async(never_ends, (1,))
        running.wait()
        print("ready", os.getpid(), flush=True)
        pending.get()
