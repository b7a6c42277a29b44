"""A job that has not imported `threading` when probing attaches (as on Debian's python3.11
or 3.8, where nothing at start-up imports it). It waits in input() in its main thread; on a
line `start PATH` it imports threading, reports what threading says about its main thread,
starts a non-daemon thread that writes PATH a moment later, and returns from main: the
interpreter must then join that thread before it exits, as it does without probing. A child
it forks writes its own report into PATH.child the same way (threading after a fork)."""

import os
import sys
import time

print("ready", os.getpid(), "threading" in sys.modules, flush=True)
command, _, path = input().partition(" ")
assert command == "start", command

import threading  # noqa: E402 - imported late on purpose: the state under test


def write_later(file: str, text: str) -> None:
    time.sleep(0.3)
    with open(file, "w") as out:
        out.write(text + "\n")


def report() -> str:
    current = threading.current_thread()
    return " ".join(
        str(part)
        for part in (
            threading.main_thread() is current,
            type(current).__name__,
            current.name,
            current.native_id == os.getpid() if hasattr(current, "native_id") else True,
        )
    )


print("main_thread_is_current", report(), flush=True)
child = os.fork()
if child == 0:
    # The child's report goes into its file: its prints would interleave with the parent's.
    threading.Thread(target=write_later, args=(path + ".child", report()), name="writer").start()
    raise SystemExit  # a normal interpreter exit, which joins the writer
threading.Thread(target=write_later, args=(path, "written by a non-daemon thread"), name="writer").start()
os.waitpid(child, 0)
