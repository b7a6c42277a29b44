"""The agent's sockets as files and descriptors: the 0700 directory, binding, the peer's
credentials, sockets left by dead processes, and closing only what is still ours.
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import socket
import stat
import struct
from typing import Any, Dict, List, Optional, Tuple

from ..originals import POLLIN, Socket, poll

AGENT_THREAD_NAME = "probing-agent"
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL


def default_socket_dir() -> str:
    return os.environ.get("PROBING_SOCKET_DIR") or f"/tmp/probing-{os.geteuid()}"


def prepare_socket_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(errno.ENOTDIR, f"{path} is not a directory")
    # Refuse a directory someone else made (or a symlink they planted) in a shared /tmp:
    # they could otherwise read or replace our socket.
    if info.st_uid != os.geteuid():
        raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to uid {os.geteuid()}")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)


def peer_credentials(conn: Socket) -> Tuple[int, int, int]:
    """(pid, uid, gid) of the process on the other end of a Unix socket."""
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid, gid


def remove_dead_sockets(directory: str) -> None:
    """Remove sockets left by processes that died without running atexit (SIGTERM, SIGKILL).

    A socket goes only when its PID is gone *and* nothing answers on it, so an agent in
    another PID namespace that shares this directory is never touched.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        pid_text, _, suffix = name.partition(".")
        if suffix != "sock" or not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # alive (or not ours to signal): leave it
        except ProcessLookupError:
            pass
        except OSError:
            continue
        path = os.path.join(directory, name)
        probe = Socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(0.2)
            probe.connect(path)
        except ConnectionRefusedError:
            try:
                os.unlink(path)
            except OSError:
                pass
        except OSError:
            pass
        finally:
            probe.close()


def high_descriptor(fd: int) -> int:
    """`fd` moved to a high number (half the soft limit on descriptors), the old one closed; `fd`
    itself when there is no room up there.

    New descriptors take the lowest free number. A job that closes every descriptor
    (os.closerange before daemonizing, or to clean up after fork) and opens files again gets the
    low numbers back: ours, up high, are then free numbers, never the job's files, so an agent
    thread still on its way through a recv() or a settimeout() on one (between its poll() and its
    recv(), say) meets a closed descriptor instead of reading or changing the job's socket.
    """
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, max(3, min(soft, 1 << 16) // 2))
    except Exception:  # noqa: BLE001 - a low descriptor still works
        return fd
    os.close(fd)
    return high


def lifted(sock: Socket) -> Socket:
    """`sock` on a high descriptor number (high_descriptor), as the C type, timeout kept."""
    timeout = sock.gettimeout()
    high = high_descriptor(sock.detach())
    try:
        moved = Socket(sock.family, sock.type, sock.proto, fileno=high)
    except BaseException:
        os.close(high)
        raise
    moved.settimeout(timeout)
    return moved


def descriptor_identity(sock: Socket) -> Optional[Tuple[int, int]]:
    """(st_dev, st_ino) of what the socket's descriptor number refers to now; None if closed."""
    try:
        info = os.fstat(sock.fileno())
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


def release(sock: Socket, identity: Optional[Tuple[int, int]], shutdown: Optional[int] = None) -> None:
    """Shut down (`shutdown`: socket.SHUT_*) or close one of the agent's sockets, but only while
    its descriptor number is still that socket.

    A job may close every descriptor (os.closerange(3, ...) before daemonizing, or in an eval)
    and open files of its own that get the same numbers: closing or shutting down "our" number
    then would close the job's file. A number that is no longer ours is forgotten instead
    (detach), so that the socket object's finalizer never closes it either.
    """
    if identity is None or descriptor_identity(sock) != identity:
        try:
            sock.detach()
        except OSError:
            pass
        return
    try:
        if shutdown is None:
            sock.close()
        else:
            sock.shutdown(shutdown)
    except OSError:
        pass


def bind_listener(socket_dir: Optional[str], backlog: int) -> Tuple[Socket, str]:
    """A listening socket at `<socket dir>/<pid>.sock`, mode 0600, in a directory of ours, 0700."""
    directory = socket_dir or default_socket_dir()
    prepare_socket_dir(directory)
    path = os.path.join(directory, f"{os.getpid()}.sock")
    if len(os.fsencode(path)) > _SOCKET_PATH_MAX:
        raise OSError(errno.ENAMETOOLONG, f"socket path {path!r} is too long for AF_UNIX")
    # A file left here belongs to an earlier process with our PID (killed with SIGKILL):
    # the directory is ours alone, so it is safe to replace.
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = lifted(Socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC))
    try:
        listener.settimeout(None)  # not the job's socket.setdefaulttimeout()
        listener.bind(path)
        # chmod after bind rather than umask: umask is process-wide and the target's
        # other threads may be creating files right now. The 0700 directory closes the gap.
        os.chmod(path, 0o600)
        listener.listen(backlog)
    except BaseException:
        listener.close()
        raise
    return listener, path


def accept(listener: Socket) -> Tuple[Socket, Any]:
    """The next connection and its peer's address, as the C socket type (socket.socket.accept
    would build it from the socket module's global `socket`, which the job may have replaced:
    originals.py)."""
    descriptor, address = listener._accept()  # type: ignore[attr-defined]
    try:
        descriptor = high_descriptor(descriptor)
        conn = Socket(listener.family, listener.type, listener.proto, fileno=descriptor)
    except BaseException:
        os.close(descriptor)
        raise
    conn.settimeout(None)  # blocking, whatever the job's socket.setdefaulttimeout() says
    return conn, address


# SO_LINGER on, 0 s: close() resets the connection instead of the FIN handshake.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


def reset(sock: Socket, identity: Optional[Any]) -> None:
    """Close a peer's connection with a reset, while its descriptor is still ours (else forget
    the number, as release() does). One identity check: a flood pays this per connection."""
    if identity is None or descriptor_identity(sock) != identity:
        release(sock, None)
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class Poller:
    """What the agent needs of selectors.PollSelector: sockets registered with a value, and the
    values of those with something to read. On originals.poll: `selectors` takes select.poll
    when it is imported, and may be imported only after the job replaced or removed it."""

    def __init__(self) -> None:
        self._poll = poll()
        self._fds: Dict[Socket, int] = {}  # the number each was registered under: it may close
        self._values: Dict[int, Any] = {}

    def register(self, sock: Socket, value: Any) -> None:
        descriptor = sock.fileno()
        self._poll.register(descriptor, POLLIN)
        self._fds[sock] = descriptor
        self._values[descriptor] = value

    def unregister(self, sock: Socket) -> None:
        """KeyError for a socket that is not registered."""
        descriptor = self._fds.pop(sock)
        del self._values[descriptor]
        try:
            self._poll.unregister(descriptor)
        except (KeyError, OSError):
            pass

    def select(self, timeout: float) -> List[Any]:
        """The values of the sockets that can be read (or have hung up), after at most `timeout`
        seconds."""
        ready = self._poll.poll(max(0, int(timeout * 1000 + 0.999)))
        return [self._values[descriptor] for descriptor, _ in ready if descriptor in self._values]

    def close(self) -> None:
        self._fds.clear()
        self._values.clear()


def socket_pair() -> Tuple[Socket, Socket]:
    """A connected pair of Unix sockets, as the C type (socket.socketpair may be the job's)."""
    import _socket

    first, second = _socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    return lifted(first), lifted(second)


def remove_socket_file(path: str) -> None:
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass
