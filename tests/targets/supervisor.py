"""A job whose main thread only supervises while a worker thread does the work (training in a
worker thread, a server, an RL actor):

    --main sleep         the main thread loops on `time.sleep(1)` while the worker is alive
    --main poll          it polls every 0.1 s (`Event.wait(0.1)`) until the worker is done
    --main wait          it waits once, for good (`Event.wait()`, no timeout): the rule cannot
                         tell that from a stuck main thread; `--thread worker` can

    --worker compute     the worker computes (forward, backward: its stack changes)
    --worker stuck       the worker blocks on a lock forever
    --worker stuck-in-c  the worker sleeps in C forever (libc's sleep, the GIL released)

    --seconds S          the computing worker stops after S seconds and the job exits 0
    --loader             a second worker, `loader`, computes as well (for a stuck `worker`)

Says `ready <worker's native id>` once the worker works, as the main thread enters its loop (a
stuck worker: once it is about to block; the test waits until the kernel shows it blocked).
"""

import argparse
import ctypes
import hashlib
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--main", choices=("sleep", "poll", "wait"), default="sleep")
parser.add_argument("--worker", choices=("compute", "stuck", "stuck-in-c"), default="compute")
parser.add_argument("--seconds", type=float, default=None)
parser.add_argument("--loader", action="store_true")
options = parser.parse_args()

started = threading.Event()
done = threading.Event()
native_id = []


# Like a training step's kernels, the work is in C without the GIL (hashlib lets it go for
# large buffers), so that the agent answers while the worker works; in six functions of equal
# cost, so that its stack changes from one look to the next however little CPU a loaded machine
# gives it (five looks all landing in one of them: 6 / 6**5).
def load(block):
    return hashlib.sha256(block).digest()


def forward(block):
    return hashlib.sha256(block).digest()


def loss(block):
    return hashlib.sha256(block).digest()


def backward(block):
    return hashlib.sha256(block).digest()


def optimize(block):
    return hashlib.sha256(block).digest()


def log(block):
    return hashlib.sha256(block).digest()


def compute(seconds):
    block = bytes(1 << 20)
    began = time.monotonic()
    while seconds is None or time.monotonic() - began < seconds:
        for phase in (load, forward, loss, backward, optimize, log):
            phase(block)
        started.set()


def work():
    native_id.append(threading.get_native_id())
    if options.worker == "compute":
        compute(options.seconds)
    elif options.worker == "stuck":
        lock = threading.Lock()
        lock.acquire()
        started.set()
        lock.acquire()  # never returns
    else:
        started.set()
        ctypes.CDLL(None).sleep(3600)  # in C, without the GIL
    done.set()


if options.loader:
    threading.Thread(target=compute, args=(None,), name="loader", daemon=True).start()
worker = threading.Thread(target=work, name="worker", daemon=True)
worker.start()
started.wait()
print("ready", native_id[0], flush=True)
if options.main == "sleep":
    while worker.is_alive():
        time.sleep(1)
elif options.main == "poll":
    while not done.wait(0.1):
        pass
else:
    done.wait()
