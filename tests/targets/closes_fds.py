"""A job that closes every descriptor above 2 when told to (a line `close` on stdin), as a
job does before it daemonizes or execs (up to the limit on descriptors, so the agent's too); it
prints "closed" once they are closed. A line `reopen` makes it open 8 pipes of its own at the
lowest numbers, as new files get, and pipes on every number it had open before `close` (the
agent's old ones among them, whatever they were), and print "reopened FDS"; `check` writes
through each and reads it back, printing "pipes ok" or "pipes broken: ...". A thread named
"worker" waits meanwhile. Exits when its stdin closes."""

import os
import sys
import threading

from taken_numbers import close_every_descriptor, pairs_on

stop = threading.Event()


def worker_loop():
    stop.wait()


threading.Thread(target=worker_loop, name="worker", daemon=True).start()
print("ready", os.getpid(), flush=True)
had = []
for line in sys.stdin:
    command = line.strip()
    if command == "close":
        had = close_every_descriptor()
        print("closed", flush=True)
    elif command == "reopen":
        pipes = [os.pipe() for _ in range(8)]
        pipes += pairs_on(
            [number for number in had if number not in {fd for pair in pipes for fd in pair}], os.pipe
        )
        print("reopened", *[fd for pair in pipes for fd in pair], flush=True)
    elif command == "check":
        broken = []
        for number, (read_end, write_end) in enumerate(pipes):
            try:
                os.write(write_end, b"%d" % number)
                if os.read(read_end, 16) != b"%d" % number:
                    broken.append(f"{read_end}:{write_end} read back wrong")
            except OSError as error:
                broken.append(f"{read_end}:{write_end} {error}")
        print("pipes ok" if not broken else "pipes broken: " + "; ".join(broken), flush=True)
stop.set()
