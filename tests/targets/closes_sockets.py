"""A job that closes every descriptor above 2 when told to (a line `close` on stdin; up to the
limit on descriptors, so the agent's too), then opens socketpairs of its own: 12 at the lowest
numbers, as new files get, and more on every number it had open before (the agent's old ones
among them, dup2()ed there), and prints "reopened FD FD ..."; a line `check` sends through each
pair both ways and reads the bytes back, printing "sockets ok" or "sockets broken: ..." (bytes
the job never sent, found in its sockets, count as broken). A thread named "worker" waits
meanwhile. Exits when its stdin closes."""

import errno
import os
import socket
import sys
import threading
import time


def put(fd, number):
    """dup2(), again while the number is being handed out by an open() elsewhere (EBUSY)."""
    for _ in range(100):
        try:
            os.dup2(fd, number)
            return
        except OSError as error:
            if error.errno != errno.EBUSY:
                raise
            time.sleep(0.001)
    os.dup2(fd, number)


def taking(numbers):
    """Socketpairs whose ends are dup2()ed onto `numbers`, two by two."""
    pairs = []
    for left_at, right_at in zip(numbers[::2], numbers[1::2]):
        left, right = socket.socketpair()
        put(left.fileno(), left_at)
        put(right.fileno(), right_at)
        left.close()
        right.close()
        pairs.append((socket.socket(fileno=left_at), socket.socket(fileno=right_at)))
    return pairs


stop = threading.Event()
threading.Thread(target=stop.wait, name="worker", daemon=True).start()
print("ready", os.getpid(), flush=True)
pairs = []
for line in sys.stdin:
    command = line.strip()
    if command == "close":
        had = sorted(int(name) for name in os.listdir("/proc/self/fd") if int(name) > 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        pairs = [socket.socketpair() for _ in range(12)]
        taken = {end.fileno() for pair in pairs for end in pair}
        pairs += taking([number for number in had if number not in taken])
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
