"""A job that replaces the modules the agent runs on, after it was attached, as sandboxes,
auditors, freezegun and gevent do. Its hooks fail fast, as training frameworks' do: an exception
of any thread (threading.excepthook) ends it with status 70, an unraisable one (what leaves a
`_thread` thread) with 71. Each stdin line names what to replace next:

  socket     socket.socket, socketpair and create_connection raise; select.poll and select.select
             are gone; _thread.start_new_thread raises (threads are forbidden)
  clocks     time.monotonic/time/perf_counter frozen, time.sleep raises; json's dumps, loads,
             JSONEncoder and JSONDecoder raise; threading.Event/Lock/Condition raise
  gevent     gevent.monkey.patch_all()

and `patched NAME` is printed once it is done. "ready" once its hooks are in. On stdin's end it
exits 0. The main thread keeps working throughout (a counter other threads never touch).
"""

import os
import sys
import threading
import time


def fail_fast(status):
    def hook(*args):
        os.write(2, f"HOOK {status}: {args!r:.300}\n".encode())
        os._exit(status)

    return hook


threading.excepthook = fail_fast(70)
sys.unraisablehook = fail_fast(71)


def forbidden(what):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{what} is forbidden in this job")

    return refuse


class Forbidden:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} is forbidden in this job")


def patch_socket():
    import _thread
    import select
    import socket

    class socket_socket(Forbidden):
        pass

    socket.socket = socket_socket
    socket.socketpair = forbidden("socket.socketpair")
    socket.create_connection = forbidden("socket.create_connection")
    for name in ("poll", "select", "epoll"):
        if hasattr(select, name):
            delattr(select, name)
    _thread.start_new_thread = forbidden("_thread.start_new_thread")


def patch_clocks():
    import json

    frozen = time.time()
    time.monotonic = lambda: 1000.0
    time.time = lambda: frozen
    time.perf_counter = lambda: 1000.0
    time.sleep = forbidden("time.sleep")
    json.dumps = forbidden("json.dumps")
    json.loads = forbidden("json.loads")

    class JSONEncoder(Forbidden):
        pass

    class JSONDecoder(Forbidden):
        pass

    json.JSONEncoder, json.JSONDecoder = JSONEncoder, JSONDecoder
    threading.Event = forbidden("threading.Event")
    threading.Lock = forbidden("threading.Lock")
    threading.Condition = forbidden("threading.Condition")


def patch_gevent():
    from gevent import monkey

    monkey.patch_all()


PATCHES = {"socket": patch_socket, "clocks": patch_clocks, "gevent": patch_gevent}

print("ready", flush=True)
counter = 0
for line in sys.stdin:
    name = line.strip()
    if name in PATCHES:
        PATCHES[name]()
        print(f"patched {name}", flush=True)
    counter += 1
print("done", counter, flush=True)
