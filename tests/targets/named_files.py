"""Frames "from" the files named on the command line (a code object's co_filename is whatever
the job compiled it with): the main thread waits at line 1 of argv[1], a thread named "worker"
at line 1 of argv[2]. "ready" once both wait. Exits when its stdin closes."""

import sys
import threading

secret, visible = sys.argv[1], sys.argv[2]
stop = threading.Event()


def wait():
    stop.wait()


def work():
    exec(compile("wait()", visible, "exec"), {"wait": wait})


def watch_stdin():
    sys.stdin.read()
    stop.set()


threading.Thread(target=work, name="worker", daemon=True).start()
threading.Thread(target=watch_stdin, name="stdin", daemon=True).start()
print("ready", flush=True)
exec(compile("wait()", secret, "exec"), {"wait": wait})
