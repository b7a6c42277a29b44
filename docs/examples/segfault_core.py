"""A job that crashes in native code called from Python, and the core file the kernel writes.

    python docs/examples/segfault_core.py --crash     # the job alone: dies of SIGSEGV at step 3

Without --crash (docs/core-files.md runs it this way), it runs the job in /tmp/core-demo-PID
(PID: its own) with cores allowed, as `ulimit -c unlimited` would, and prints "ready" once
the kernel has written /tmp/core-demo-PID/core; then it waits until its stdin closes. Needs a
kernel that writes cores into the crashing process's directory (/proc/sys/kernel/core_pattern
`core`, the kernel's default); the directories of earlier runs are removed.
"""

import ctypes
import os
import resource
import shutil
import subprocess
import sys
import threading

DEMO_DIRECTORY = "/tmp/core-demo-{}"


def decode(batch):
    # A C function given a bad pointer, as a buggy extension would: the job dies right here.
    return ctypes.string_at(0)


def train_step(step):
    batch = step * 8
    if step == 3:
        decode(batch)
    return batch


def save_checkpoints(stop):
    stop.wait()


def innermost_function(thread):
    frame = sys._current_frames().get(thread.ident)
    return frame.f_code.co_name if frame is not None else None


def crash():
    stop = threading.Event()
    saver = threading.Thread(target=save_checkpoints, args=(stop,), name="checkpointer", daemon=True)
    saver.start()
    while innermost_function(saver) != "wait":  # the checkpointer waits before the job crashes
        threading.Event().wait(0.001)
    for step in range(10):
        train_step(step)


def remove_earlier_runs():
    for name in os.listdir("/tmp"):
        pid = name[len("core-demo-") :]
        if name.startswith("core-demo-") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join("/tmp", name), ignore_errors=True)


def allow_cores():
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def main():
    remove_earlier_runs()
    directory = DEMO_DIRECTORY.format(os.getpid())
    os.makedirs(directory)
    subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--crash"], cwd=directory, preexec_fn=allow_cores
    )
    written = [name for name in os.listdir(directory) if name.startswith("core")]
    if written:  # core.PID where /proc/sys/kernel/core_uses_pid is 1
        os.rename(os.path.join(directory, written[0]), os.path.join(directory, "core"))
    else:
        with open("/proc/sys/kernel/core_pattern") as pattern:
            sys.exit(f"no core in {directory}: core_pattern is {pattern.read().strip()!r}")
    print("ready", flush=True)
    for _ in sys.stdin:
        pass


if __name__ == "__main__":
    crash() if sys.argv[1:] == ["--crash"] else main()
