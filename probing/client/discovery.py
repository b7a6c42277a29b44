"""Finding a target's agent: the process checked (alive, Python, ours to look at), then the
socket its agent would listen on.

Never prints; failures are ProbingErrors that say what to do. On the path of every `probing PID
backtrace`: stdlib only and cheap to import.
"""

from __future__ import annotations

import os

from ..errors import NoAgent, NotPython, PermissionDenied, ProcessNotFound
from ..procfs import effective_uid, environ_value, namespace_pid, process_alive, python_version, start_ticks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Tuple

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


class View:
    """How a process sees the file system and itself, from where the CLI stands.

    A process in another mount namespace (a container) has its own /tmp, and one in a chroot
    its own / in our namespace: either way its files are reached through /proc/PID/root. In
    another PID namespace it knows itself by another number, which is the one in its socket's
    name.
    """

    __slots__ = ("root", "own_pid")

    def __init__(self, pid: int) -> None:
        self.root = ""
        self.own_pid = pid
        try:
            if os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino:
                self.root = f"/proc/{pid}/root"
        except OSError:
            pass
        try:
            theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/proc/self/root")
            if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
                self.root = f"/proc/{pid}/root"  # a chroot (or we are in one)
        except OSError:
            pass
        self.own_pid = namespace_pid(pid)

    def path(self, inside: str) -> str:
        """A path of the process's file system, as the CLI reaches it."""
        return self.root + inside


# What socket_candidates read of each process, by (PID, start time): `hang` connects to each rank
# of its node once a sample and `top` once a refresh, and these reads were most of a connect's
# CPU (64 ranks x 10 samples of a 1 024-rank `hang`). A PID reused by a new process is read anew.
# Each: how the process sees the file system and itself, its own PROBING_SOCKET_DIR, its uid.
_seen: Dict[Tuple[int, int], Tuple[View, Optional[str], Optional[int]]] = {}
_MAX_SEEN = 4096


def _seen_of(pid: int) -> Tuple[View, Optional[str], Optional[int]]:
    started = start_ticks(pid)
    known = _seen.get((pid, started)) if started is not None else None
    if known is None:
        known = (View(pid), environ_value(pid, "PROBING_SOCKET_DIR"), effective_uid(pid))
        if started is not None:
            if len(_seen) >= _MAX_SEEN:
                _seen.clear()
            _seen[(pid, started)] = known
    return known


def socket_candidates(pid: int) -> List[str]:
    """Where the agent of `pid` would have put its socket, most specific first."""
    view, socket_dir, uid = _seen_of(pid)
    # The job's own PROBING_SOCKET_DIR and default directory are paths in its file system;
    # ours applies only when we share one.
    directories = [view.path(socket_dir)] if socket_dir else []
    if not view.root and os.environ.get("PROBING_SOCKET_DIR"):
        directories.append(os.environ["PROBING_SOCKET_DIR"])
    directories.append(view.path(f"/tmp/probing-{uid if uid is not None else os.geteuid()}"))
    seen: List[str] = []
    for directory in directories:
        path = os.path.join(directory, f"{view.own_pid}.sock")
        if path not in seen:
            seen.append(path)
    return seen
