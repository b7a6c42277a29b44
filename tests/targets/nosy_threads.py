"""A job whose worker thread is a Thread subclass that defines `name`, `ident`, `native_id`,
`daemon`, `is_alive` and `__class__` itself: read from a thread that is not the job's, each of
them notes that it ran and raises. probing must read every thread from threading's own fields
and never run them. "ready" once the worker waits in crunch(); on stdin's end it prints the
properties that ran, `ran: [...]`, and exits 0. Stdlib only: it runs under every interpreter
of the suite."""

import os
import sys
import threading

ran = []
MAIN = threading.get_ident()


def _guarded(what, read):
    """threading itself reads these in the job's own threads: there they answer; in any other
    thread (the agent's) they note that they ran and raise."""

    def guarded(self, *args):
        if threading.get_ident() not in (MAIN, self.__dict__.get("_ident")):
            ran.append(what)
            raise RuntimeError(f"the job's own {what} ran")
        return read(self, *args)

    return guarded


def _field(name):
    return property(_guarded(name, lambda self: self.__dict__[f"_{name}"]))


class NosyThread(threading.Thread):
    name = _field("name")
    ident = _field("ident")
    native_id = _field("native_id")
    daemon = property(_guarded("daemon", lambda self: self.__dict__["_daemonic"]))
    is_alive = _guarded("is_alive()", threading.Thread.is_alive)
    __class__ = property(_guarded("__class__", lambda self: NosyThread))


stop = threading.Event()
inside = threading.Event()


def crunch():
    batch_size = 32  # noqa: F841 - a local that eval finds in this thread's frame
    inside.set()
    stop.wait()


worker = NosyThread(target=crunch, name="nosy-worker", daemon=True)
worker.start()
inside.wait()
print("ready", os.getpid(), flush=True)
for _ in sys.stdin:
    pass
stop.set()
print("ran:", ran, flush=True)
