"""Finding a target's agent: the process checked (alive, Python, ours to look at), then the
socket its agent would listen on.

Never prints; failures are ProbingErrors that say what to do. On the path of every `probing PID
backtrace`: stdlib only and cheap to import.
"""

from __future__ import annotations

import os

from ..errors import NoAgent, NotPython, PermissionDenied, ProcessNotFound
from ..procfs import process_alive, python_version, socket_candidates

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

    Log = Callable[[str], None]

_NOT_PTRACEABLE_AS_ROOT = (
    "probing runs as root without the right to ptrace it: in a container, start it with "
    "`docker run --cap-add=SYS_PTRACE`; or start the job with the agent: "
    "`probing run -- python train.py`"
)


def no_log(message: str) -> None:
    pass


def require_process(pid: int) -> None:
    if pid <= 0 or not process_alive(pid):
        raise ProcessNotFound(f"no process with PID {pid}", hint="check the PID with `probing list`")


def python_version_of(pid: int) -> Optional[str]:
    """'3.11' from the executable's or libpython's name; None when the process is not Python.

    Raises ProcessNotFound when it is gone and PermissionDenied when /proc does not let us look
    (another user's process, or root without CAP_SYS_PTRACE).
    """
    try:
        return python_version(pid)
    except FileNotFoundError:
        raise ProcessNotFound(f"no process with PID {pid}") from None
    except PermissionError:
        # Root that may not look: CAP_SYS_PTRACE dropped (a container's default) or Yama.
        hint = _NOT_PTRACEABLE_AS_ROOT if os.geteuid() == 0 else None
        raise PermissionDenied(f"not allowed to inspect PID {pid}", hint=hint) from None


def agent_listens(path: str) -> bool:
    """Whether something accepts connections on the socket at `path` (connects, says nothing)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def locate_socket(pid: int, log: Log = no_log) -> str:
    """The socket of the agent in `pid`, or the ProbingError that says why there is none."""
    require_process(pid)
    candidates = socket_candidates(pid)
    denied = None
    for path in candidates:
        try:
            # lstat: a symlink planted where the socket should be is found here, and refused
            # by the Client with a message, rather than followed.
            os.lstat(path)
        except FileNotFoundError:
            log(f"no socket at {path}")
            continue
        except PermissionError:
            log(f"not allowed to look at {path}")
            denied = path
            continue
        log(f"agent socket: {path}")
        return path
    version = python_version_of(pid)
    if version is None:
        raise NotPython(f"PID {pid} is not a Python process")
    if denied is not None:
        raise PermissionDenied(f"not allowed to reach the agent of PID {pid} ({denied})")
    raise NoAgent(f"PID {pid} (Python {version}) has no probing agent")
