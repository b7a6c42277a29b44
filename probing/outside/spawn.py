"""Run a short helper program (py-spy) and collect what it prints, within a time limit.

`subprocess` is not used here: importing it (with selectors, signal and threading) costs
`probing PID backtrace` a few milliseconds on the path where a stuck job is read from outside,
where py-spy itself takes little more than ten. posix_spawn, two pipes and poll do the same.
"""

from __future__ import annotations

import os
import select
import time

# The module `signal` imports enum (milliseconds, for one constant); SIGKILL is 9 on Linux.
SIGKILL = 9

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Tuple


class TimedOut(Exception):
    """The program did not finish within its time; it was killed."""


def run(argv: List[str], timeout: float) -> Tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of `argv`; a status < 0 is the signal that ended it."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        pid = os.posix_spawn(
            argv[0],
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out_write, 1),
                (os.POSIX_SPAWN_DUP2, err_write, 2),
            ],
        )
    except BaseException:
        for descriptor in (out_read, out_write, err_read, err_write):
            os.close(descriptor)
        raise
    os.close(out_write)
    os.close(err_write)
    chunks: Dict[int, List[bytes]] = {out_read: [], err_read: []}
    poller = select.poll()
    for descriptor in chunks:
        poller.register(descriptor, select.POLLIN)
    deadline = time.monotonic() + timeout
    open_ends = set(chunks)
    try:
        while open_ends:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, SIGKILL)
                raise TimedOut(argv[0])
            for descriptor, _ in poller.poll(left * 1000):
                data = os.read(descriptor, 65536)
                if data:
                    chunks[descriptor].append(data)
                else:
                    poller.unregister(descriptor)
                    open_ends.discard(descriptor)
    finally:
        os.close(out_read)
        os.close(err_read)
        _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8
    return code, b"".join(chunks[out_read]), b"".join(chunks[err_read])
