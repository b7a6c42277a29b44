"""The main thread blocked inside a C call that released the GIL (as an NCCL wait does).

"ready" comes from a short-lived thread once /proc shows the main thread inside nanosleep: the
main thread cannot announce a call it is blocked in. That thread is a bare `_thread`, so the
job still never imports `threading`, and it ends as soon as it has written.
"""

import _thread
import ctypes
import os
import time

# nanosleep and clock_nanosleep (glibc's sleep uses the latter), by machine.
SLEEP_SYSCALLS = {"x86_64": (35, 230), "aarch64": (101, 115)}


def announce_once_asleep(main_thread_id):
    wanted = SLEEP_SYSCALLS.get(os.uname().machine)
    while wanted is not None:
        with open(f"/proc/self/task/{main_thread_id}/syscall") as syscall:
            number = syscall.read().split(" ", 1)[0]
        if number.isdigit() and int(number) in wanted:
            break
        time.sleep(0.001)
    os.write(1, b"ready\n")


_thread.start_new_thread(announce_once_asleep, (os.getpid(),))
ctypes.CDLL(None).sleep(3600)
