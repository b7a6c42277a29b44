"""A SIGTERM that lands while the main thread holds a ring's lock (as inside Ring.append), for a
job with a SIGTERM handler of its own that writes FILE (argv[1]) and exits with status 7.

Prints `ready` once the memory sampler's ring holds rows, then takes its lock in the main thread
and sends itself SIGTERM there: the record needs that very lock.
"""

import os
import signal
import sys
import time

from probing.agent.memory import sampler


def on_sigterm(signum, frame):  # type: ignore[no-untyped-def]
    with open(sys.argv[1], "w") as note:
        note.write(f"job handler ran for {signum}\n")
    sys.exit(7)


signal.signal(signal.SIGTERM, on_sigterm)
while sampler.current() is None or sampler.current().ring is None or len(sampler.current().ring) == 0:
    time.sleep(0.01)
ring = sampler.current().ring
print("ready", flush=True)
with ring.lock:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)  # reached only if the handler returned: it exits, so never
