"""Facts about a process from /proc: is it there, whose is it, is it Python, where is its agent.

Stdlib only and cheap: `probing PID backtrace` calls this on every run.
"""

from __future__ import annotations

import os

from .errors import PermissionDenied, ProcessNotFound

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional

_PYTHON_EXE = r"^python(\d+(\.\d+)?)?[a-z]*$"
_LIBPYTHON = r"libpython(\d+\.\d+)[a-z]*\.so"
_PYTHON_VERSION_IN_NAME = r"python(\d+\.\d+)"


def process_alive(pid: int) -> bool:
    """Whether `pid` exists and has not exited (a zombie waiting to be reaped has)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def require_process(pid: int) -> None:
    if pid <= 0 or not process_alive(pid):
        raise ProcessNotFound(f"no process with PID {pid}", hint="check the PID with `probing list`")


def effective_uid(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Uid:"):
                    return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        return None
    return None


def environ_value(pid: int, name: str) -> Optional[str]:
    """A variable of the process's start-up environment (None if unreadable or unset)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            data = environ.read()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            return os.fsdecode(entry[len(prefix) :])
    return None


def python_version_of(pid: int) -> Optional[str]:
    """'3.11' from the executable's or libpython's name; None when the process is not Python.

    Raises PermissionDenied when /proc does not let us look (another user's process).
    """
    import re  # only on the way to an error message or `probing list`: keep re off the fast path

    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except FileNotFoundError:
        raise ProcessNotFound(f"no process with PID {pid}") from None
    except PermissionError:
        if os.geteuid() == 0:
            # Root that may not look: CAP_SYS_PTRACE dropped (a container's default) or Yama.
            hint = (
                "probing runs as root without the right to ptrace it: in a container, start it with "
                "`docker run --cap-add=SYS_PTRACE`; or start the job with the agent: "
                "`probing run -- python train.py`"
            )
        else:
            hint = "run probing as the user that owns the process, or as root"
        raise PermissionDenied(f"not allowed to inspect PID {pid}", hint=hint) from None
    except OSError:  # a kernel thread has no executable
        return None
    exe = exe.replace(" (deleted)", "")
    if re.match(_PYTHON_EXE, exe):
        match = re.search(_PYTHON_VERSION_IN_NAME, exe)
        if match:
            return match.group(1)
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            found = re.search(_LIBPYTHON, os.fsdecode(maps.read()))
    except OSError:
        found = None
    if found:
        return found.group(1)
    return "3" if re.match(_PYTHON_EXE, exe) else None


class View:
    """How a process sees the file system and itself, from where the CLI stands.

    A process in another mount namespace (a container) has its own /tmp: its files are
    reached through /proc/PID/root. In another PID namespace it knows itself by another
    number, which is the one in its socket's name.
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
            with open(f"/proc/{pid}/status", "rb") as status:
                for line in status:
                    if line.startswith(b"NSpid:"):
                        self.own_pid = int(line.split()[-1])
        except (OSError, ValueError, IndexError):
            pass

    def path(self, inside: str) -> str:
        """A path of the process's file system, as the CLI reaches it."""
        return self.root + inside


def socket_candidates(pid: int) -> List[str]:
    """Where the agent of `pid` would have put its socket, most specific first."""
    view = View(pid)
    # The job's own PROBING_SOCKET_DIR and default directory are paths in its file system;
    # ours applies only when we share one.
    directories = [view.path(d) for d in (environ_value(pid, "PROBING_SOCKET_DIR"),) if d]
    if not view.root and os.environ.get("PROBING_SOCKET_DIR"):
        directories.append(os.environ["PROBING_SOCKET_DIR"])
    uid = effective_uid(pid)
    directories.append(view.path(f"/tmp/probing-{uid if uid is not None else os.geteuid()}"))
    seen: List[str] = []
    for directory in directories:
        path = os.path.join(directory, f"{view.own_pid}.sock")
        if path not in seen:
            seen.append(path)
    return seen
