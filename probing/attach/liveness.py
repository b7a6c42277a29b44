"""Whether a live process's agent stopped listening: its socket file is there, the process
runs, and connecting is refused. Read from outside; never prints.

A listener dies while its process lives when code in the job closes the descriptor (a job
that closes every descriptor above 2 before it daemonizes or execs, or an eval that closes
it). Such a process can still be read from outside, and attached to again: a new agent binds
the same path. A socket file older than the process was left by an earlier process with the
same PID (killed before it could remove it): that one is simply no agent.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from typing import Optional

from ..client.discovery import socket_candidates
from ..procfs import process_alive, start_time


def _refused(path: str) -> bool:
    # A full backlog makes a Unix-socket connect wait (or EAGAIN), never ECONNREFUSED: refused
    # means that no socket listens at this address any more.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        try:
            probe.connect(path)
        except OSError as error:
            return error.errno == errno.ECONNREFUSED
    return False


def stopped_agent(pid: int) -> Optional[str]:
    """The socket of the agent in `pid` that no longer listens, if the process is alive."""
    for path in socket_candidates(pid):
        try:
            info = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISSOCK(info.st_mode) or not _refused(path):
            continue
        started = start_time(pid)
        # btime has a resolution of a second: a socket bound in the process's first second
        # must not pass for an earlier process's.
        if started is not None and info.st_mtime < started - 1.0:
            continue
        if process_alive(pid):
            return path
    return None
