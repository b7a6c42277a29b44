"""A job that closes every descriptor above 2 when told to (a line `close` on stdin; up to the
limit on descriptors, so the agent's too), then opens socketpairs of its own: 12 at the lowest
numbers, as new files get, and more on every number it had open before (the agent's old ones
among them, dup2()ed there), and prints "reopened FD FD ..."; a line `check` sends through each
pair both ways and reads the bytes back, printing "sockets ok" or "sockets broken: ..." (bytes
the job never sent, found in its sockets, count as broken). A thread named "worker" waits
meanwhile. Exits when its stdin closes."""

import os
import socket
import sys
import threading

from taken_numbers import close_every_descriptor, pairs_on


def socketpair_descriptors():
    left, right = socket.socketpair()
    return left.detach(), right.detach()


stop = threading.Event()
threading.Thread(target=stop.wait, name="worker", daemon=True).start()
print("ready", os.getpid(), flush=True)
pairs = []
for line in sys.stdin:
    command = line.strip()
    if command == "close":
        had = close_every_descriptor()
        pairs = [socket.socketpair() for _ in range(12)]
        taken = {end.fileno() for pair in pairs for end in pair}
        on_ours = pairs_on([number for number in had if number not in taken], socketpair_descriptors)
        pairs += [(socket.socket(fileno=left), socket.socket(fileno=right)) for left, right in on_ours]
        print("reopened", *[end.fileno() for pair in pairs for end in pair], flush=True)
    elif command == "check":
        broken = []
        for number, (left, right) in enumerate(pairs):
            try:
                for sender, receiver in ((left, right), (right, left)):
                    receiver.setblocking(False)
                    try:
                        stray = receiver.recv(4096)
                        broken.append(f"{receiver.fileno()} held {stray!r} the job never sent")
                    except BlockingIOError:
                        pass
                    receiver.setblocking(True)
                    sender.sendall(b"%d" % number)
                    if receiver.recv(16) != b"%d" % number:
                        broken.append(f"{receiver.fileno()} read back wrong")
            except OSError as error:
                broken.append(f"{left.fileno()}:{right.fileno()} {error}")
        print("sockets ok" if not broken else "sockets broken: " + "; ".join(broken), flush=True)
stop.set()
