"""Whether a socket, and the process answering on it, are the target's own.

Root inspects other users' jobs, and a job may be hostile: the socket directory comes from
the job's own environment (PROBING_SOCKET_DIR), so a job could point it at a directory
holding a symlink to someone else's agent and have root's commands run there. Before a
request goes out the CLI checks

- the directory: owned by the target's uid, mode 0700 (what the agent makes it), not a symlink;
- the socket: a socket (not a symlink to one), owned by the target's uid;
- the peer (SO_PEERCRED): the process that listens is the target, running as its uid.

Stdlib only and cheap to import: every `probing PID backtrace` runs these checks.
"""

from __future__ import annotations

import _socket
import os
import stat
import struct

from ..errors import UntrustedSocket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional, Tuple

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class ExpectedPeer:
    """Who must answer on a socket: `pid` as the CLI sees it (None: any process known by
    `own_pid` in its own PID namespace), and `uid`."""

    __slots__ = ("pid", "own_pid", "uid", "why")

    def __init__(self, pid: Optional[int], own_pid: Optional[int], uid: int, why: str) -> None:
        self.pid = pid
        self.own_pid = own_pid
        self.uid = uid
        self.why = why  # "PID 123" or "the socket /x/123.sock", for messages


def _owner_name(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_socket_file(path: str, uid: int, who: str) -> None:
    """Refuse a socket whose directory or file another user controls, or a symlink."""
    directory = os.path.dirname(path) or "."
    try:
        info = os.lstat(directory)
    except OSError as error:
        raise UntrustedSocket(f"cannot check the socket directory {directory} of {who}: {error}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UntrustedSocket(f"the socket directory {directory} of {who} is a symlink, not a directory")
    if info.st_uid != uid:
        raise UntrustedSocket(
            f"the socket directory {directory} of {who} belongs to {_owner_name(info.st_uid)}, "
            f"not to the process's {_owner_name(uid)}: refusing to use it"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise UntrustedSocket(
            f"the socket directory {directory} of {who} has mode {stat.S_IMODE(info.st_mode):04o}, "
            "not 0700: other users could have replaced the socket; refusing to use it",
            hint=f"`chmod 700 {directory}` as its owner (the agent makes its directory 0700)",
        )
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return  # connect() says so, with the right message
    except OSError as error:
        raise UntrustedSocket(f"cannot check the socket {path} of {who}: {error}") from None
    if stat.S_ISLNK(info.st_mode):
        raise UntrustedSocket(f"the socket {path} of {who} is a symlink: refusing to follow it")
    if not stat.S_ISSOCK(info.st_mode):
        raise UntrustedSocket(f"{path} is not a socket")
    if info.st_uid != uid:
        raise UntrustedSocket(
            f"the socket {path} of {who} belongs to {_owner_name(info.st_uid)}, "
            f"not to the process's {_owner_name(uid)}: refusing to use it"
        )


def expected_for_path(path: str) -> Tuple[str, ExpectedPeer]:
    """For a socket path given as the target: the real path, and who must answer on it.

    The user named this path, so symlinks in it are theirs to follow. The peer must run as
    the socket's owner and, when the name is the agent's `<pid>.sock`, be that process
    (that PID in its own namespace, for a socket reached through /proc/PID/root).
    """
    real = os.path.realpath(path)
    try:
        owner = os.stat(real).st_uid
    except OSError:
        owner = os.geteuid()  # connect() will say what is wrong with the path
    stem, _, suffix = os.path.basename(real).partition(".")
    own_pid = int(stem) if suffix == "sock" and stem.isdecimal() else None
    return real, ExpectedPeer(None, own_pid, owner, f"the socket {path}")


def peer_credentials(sock: Any) -> Tuple[int, int, int]:
    """(pid, uid, gid) of the process that listens on the other end of a Unix socket, as
    the kernel recorded them when it called listen(); the pid is in our PID namespace (0
    when that process is in a namespace we cannot see into)."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


def _own_pid_of(pid: int) -> Optional[int]:
    """The PID a process has in its own (innermost) PID namespace."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return pid


def check_peer(sock: Any, path: str, expected: ExpectedPeer) -> Tuple[int, int]:
    """Refuse a connection whose listening end is not the expected process; returns the
    peer's (pid, uid)."""
    try:
        pid, uid, _ = peer_credentials(sock)
    except OSError as error:
        raise UntrustedSocket(f"cannot tell which process answers on {path}: {error}") from None
    if uid != expected.uid:
        raise UntrustedSocket(
            f"the process answering on {path} runs as {_owner_name(uid)}, but {expected.why} "
            f"belongs to {_owner_name(expected.uid)}: refusing to talk to it"
        )
    if expected.pid is not None and pid != expected.pid:
        raise UntrustedSocket(
            f"the process answering on {path} is PID {pid}, not {expected.why}: refusing to talk to it"
        )
    if expected.pid is None and expected.own_pid is not None:
        if pid == 0 or (pid != expected.own_pid and _own_pid_of(pid) != expected.own_pid):
            shown = "a process in a PID namespace this one cannot see" if pid == 0 else f"PID {pid}"
            raise UntrustedSocket(
                f"the process answering on {path} is {shown}, not PID {expected.own_pid} that "
                "the socket's name says: refusing to talk to it"
            )
    return pid, uid
