"""A job that counts threading's threads, as many jobs do before they exit: on stdin's end its
worker stops and the main thread waits `while threading.active_count() > 1`, then exits 0 (3 if
20 s pass: an agent thread it counted would keep it there for ever). Each stdin line `report`
prints one JSON line of what `threading` knows: active_count(), enumerate()'s names, the
_DummyThread objects in `_active`, and the threads `_shutdown` would join. Its hooks (thread
exceptions, unraisable exceptions) print `HOOK ...` on stderr: probing must reach none of them.
"ready" once the worker runs. Stdlib only: it runs under every interpreter of the suite."""

import json
import sys
import threading
import time


def hook(what):
    def report(*args):
        sys.stderr.write(f"HOOK {what}: {args!r:.300}\n")

    return report


threading.excepthook = hook("threading.excepthook")
sys.unraisablehook = hook("sys.unraisablehook")

stop = threading.Event()


def work():
    while not stop.wait(0.05):
        pass


def report():
    active = dict(threading._active)
    dummies = [
        type(thread).__name__ for thread in active.values() if isinstance(thread, threading._DummyThread)
    ]
    # What _shutdown joins: the locks of non-daemon threads up to 3.12; from 3.13 their handles
    # live in _thread, where only their count is not reachable, so the names stand in for them.
    joined = [thread.name for thread in threading.enumerate() if not thread.daemon]
    print(
        json.dumps(
            {
                "active_count": threading.active_count(),
                "names": sorted(thread.name for thread in threading.enumerate()),
                "active_idents": len(active),
                "limbo": len(threading._limbo),
                "dummies": dummies,
                "shutdown_locks": len(getattr(threading, "_shutdown_locks", ())),
                "joined": sorted(joined),
            }
        ),
        flush=True,
    )


worker = threading.Thread(target=work, name="worker")
worker.start()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "report":
        report()
stop.set()
deadline = time.monotonic() + 20.0
while threading.active_count() > 1:
    if time.monotonic() > deadline:
        print("still counted:", [thread.name for thread in threading.enumerate()], flush=True)
        sys.exit(3)
    time.sleep(0.05)
print("done", flush=True)
