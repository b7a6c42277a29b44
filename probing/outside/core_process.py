"""The process that reads a core (outside/core_reader.py): how it is confined, how it is started,
and what of its output is kept.

The core and every file its notes name are the input of a parser written in C and C++ (pystack,
elfutils), and root may read any user's core. So the reader runs in a session of its own (no
controlling terminal), with stdin on /dev/null, the core open on descriptor 3 (opened and
checked here), a limit on the memory it allocates and none on its core size, no way to gain
privileges by exec, and, when root reads the core of another user, as that user: what a
hostile core makes the parser do, it does with its owner's rights only.

Its stdout and stderr are read with a deadline and a cap (`spawn.collect`): a reader that
prints more than its own bounds allow is killed, not buffered without end.
"""

from __future__ import annotations

import fcntl
import os
from typing import List, Optional, Tuple

from .elf_core import CoreFile
from .spawn import Child, collect

# Where the reader finds the core: the descriptor opened here, not the path, which another user
# may point somewhere else between the check and the read.
CORE_DESCRIPTOR = 3
CORE_IN_READER = f"/proc/self/fd/{CORE_DESCRIPTOR}"
# What the parser may allocate (RLIMIT_DATA; core_reader.limit says why not RLIMIT_AS): it
# builds its tables from the core (45 MB for a 163 MB core), so four times the core, and never
# less than 2 GiB, is room for a real core and a ceiling for a hostile one.
MIN_MEMORY = 2 << 30
MAX_STDERR_BYTES = 1 << 20


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
    return collect(Child(pid, out_read, err_read), timeout, "the core reader", max_stdout, MAX_STDERR_BYTES)
