"""The process that reads a core (outside/core_reader.py): how it is confined, how it is started,
and what of its output is kept.

The core and every file its notes name are the input of a parser written in C and C++ (pystack,
elfutils), and root may read any user's core. So the reader runs in a session of its own (no
controlling terminal), with stdin on /dev/null, the core open on descriptor 3 (opened and
checked here), a limit on the memory it allocates and none on its core size, no way to gain
privileges by exec, and, when root reads the core of another user, as that user: what a
hostile core makes the parser do, it does with its owner's rights only.

Its stdout and stderr are read here with a deadline and a cap: a reader that prints more than
its own bounds allow is killed, not buffered without end. (`spawn.collect` reads py-spy's
output without a cap; py-spy's is small, this one may not be.)
"""

from __future__ import annotations

import fcntl
import os
import select
import time

from .elf_core import CoreFile
from .spawn import TimedOut

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

# Where the reader finds the core: the descriptor opened here, not the path, which another user
# may point somewhere else between the check and the read.
CORE_DESCRIPTOR = 3
CORE_IN_READER = f"/proc/self/fd/{CORE_DESCRIPTOR}"
# What the parser may allocate (RLIMIT_DATA; core_reader.limit says why not RLIMIT_AS): it
# builds its tables from the core (45 MB for a 163 MB core), so four times the core, and never
# less than 2 GiB, is room for a real core and a ceiling for a hostile one.
MIN_MEMORY = 2 << 30
MAX_STDERR_BYTES = 1 << 20
SIGKILL = 9  # the module `signal` imports enum


class TooMuchOutput(Exception):
    """The reader printed more than its cap on `stream` ("stdout" or "stderr"); it was killed."""

    def __init__(self, stream: str, cap: int) -> None:
        super().__init__(stream)
        self.stream = stream
        self.cap = cap


def run_as_of(core: CoreFile) -> Optional[Tuple[int, int]]:
    """(uid, gid) the reader drops to: the core's owner and group, when this process is root and
    the core is another user's; None to run as this process's user."""
    if os.geteuid() != 0 or core.status.st_uid == 0:
        return None
    return core.status.st_uid, core.status.st_gid


def memory_limit_of(core: CoreFile) -> int:
    return max(MIN_MEMORY, 4 * core.status.st_size)


def confinement_arguments(core: CoreFile) -> List[str]:
    """The reader's arguments that say how to confine itself (core_reader.confine does it)."""
    run_as = run_as_of(core)
    arguments = ["--memory", str(memory_limit_of(core))]
    return arguments + (["--run-as", f"{run_as[0]}:{run_as[1]}"] if run_as is not None else [])


def run_reader(
    command: List[str], core: CoreFile, timeout: float, max_stdout: int
) -> Tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of the reader `command`, started with the core on
    descriptor 3 in a session of its own; raises TimedOut past `timeout`, TooMuchOutput past
    `max_stdout` bytes on stdout (or MAX_STDERR_BYTES on stderr). A status < 0 is a signal."""
    # Above every descriptor the file actions write, so that none overwrites another's source.
    source = fcntl.fcntl(core.descriptor, fcntl.F_DUPFD_CLOEXEC, 10)
    descriptors = [source]
    try:
        out_read, out_write = os.pipe()
        descriptors += [out_read, out_write]
        err_read, err_write = os.pipe()
        descriptors += [err_read, err_write]
        pid = os.posix_spawn(
            command[0],
            command,
            # elfutils fetches debug information over the network when DEBUGINFOD_URLS is set:
            # reading a core must not talk to anything.
            {key: value for key, value in os.environ.items() if not key.startswith("DEBUGINFOD_")},
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out_write, 1),
                (os.POSIX_SPAWN_DUP2, err_write, 2),
                (os.POSIX_SPAWN_DUP2, source, CORE_DESCRIPTOR),
            ],
            setsid=True,
        )
    except BaseException:
        for descriptor in descriptors:
            os.close(descriptor)
        raise
    for descriptor in (source, out_write, err_write):
        os.close(descriptor)
    streams = [(out_read, "stdout", max_stdout), (err_read, "stderr", MAX_STDERR_BYTES)]
    return collect_bounded(pid, streams, timeout)


def collect_bounded(
    pid: int, streams: List[Tuple[int, str, int]], timeout: float
) -> Tuple[int, bytes, bytes]:
    """What child `pid` writes to its stdout and stderr pipes (`streams`: descriptor, name, cap
    in bytes, stdout's first) until it closes them, and its exit status. The child is killed
    when it outlives `timeout` (TimedOut) or writes more than a pipe's cap (TooMuchOutput); it
    is reaped and the pipes are closed in every case."""
    caps = {descriptor: (name, cap) for descriptor, name, cap in streams}
    chunks: Dict[int, List[bytes]] = {descriptor: [] for descriptor in caps}
    sizes = dict.fromkeys(caps, 0)
    poller = select.poll()
    for descriptor in caps:
        poller.register(descriptor, select.POLLIN)
    deadline = time.monotonic() + timeout
    open_ends = set(caps)
    try:
        while open_ends:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, SIGKILL)
                raise TimedOut("the core reader")
            for descriptor, _ in poller.poll(left * 1000):
                name, cap = caps[descriptor]
                # One byte past the cap is enough to know it was passed.
                data = os.read(descriptor, min(65536, cap + 1 - sizes[descriptor]))
                if not data:
                    poller.unregister(descriptor)
                    open_ends.discard(descriptor)
                    continue
                sizes[descriptor] += len(data)
                if sizes[descriptor] > cap:
                    os.kill(pid, SIGKILL)
                    raise TooMuchOutput(name, cap)
                chunks[descriptor].append(data)
    finally:
        for descriptor in caps:
            os.close(descriptor)
        status = os.waitpid(pid, 0)[1]
    out, err = (b"".join(chunks[descriptor]) for descriptor, _, _ in streams)
    return os.waitstatus_to_exitcode(status), out, err
