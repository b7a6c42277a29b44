"""What closes_fds.py and closes_sockets.py do to the descriptors (imported from the targets'
own folder): close every one above 2 up to the limit, as daemonizing code does, and put the
job's own files on the numbers it had open before (the agent's among them)."""

import errno
import os
import time


def close_every_descriptor():
    """Close every descriptor above 2; the numbers that were open, in order."""
    had = sorted(int(name) for name in os.listdir("/proc/self/fd") if int(name) > 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    return had


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


def pairs_on(numbers, make_pair):
    """Pairs of descriptors from make_pair() (two raw descriptors) put on `numbers`, two by two;
    the numbers of each pair."""
    pairs = []
    for first_at, second_at in zip(numbers[::2], numbers[1::2]):
        first, second = make_pair()
        put(first, first_at)
        put(second, second_at)
        os.close(first)
        os.close(second)
        pairs.append((first_at, second_at))
    return pairs
