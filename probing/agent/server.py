"""The agent's socket: bind, accept, check the peer, one thread per client connection.

Idle cost is zero: the accept thread and every connection thread sit in blocking system
calls; nothing polls. Request handling (and the json/protocol imports it needs) is loaded on
the first connection, so an agent nobody talks to costs one thread and one file descriptor.
"""

from __future__ import annotations

import atexit
import errno
import os
import socket
import stat
import struct
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, List, Optional, Set, Tuple

if TYPE_CHECKING:
    from .. import protocol

AGENT_THREAD_NAME = "probing-agent"
# A connection that sends nothing for this long is closed, so a stalled client cannot pin
# a thread in the target forever.
IDLE_TIMEOUT_S = 600.0
MAX_CONNECTIONS = 16
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL


# The connection a connection thread serves, for handlers that wait long (memory --growth).
_serving = threading.local()


def client_gone() -> bool:
    """Whether the client of the connection this thread serves has closed its end."""
    conn = getattr(_serving, "connection", None)
    if conn is None:
        return False
    import select

    try:
        poller = select.poll()  # not select(): a training job may have more than 1024 descriptors
        poller.register(conn.fileno(), select.POLLIN)
        if not poller.poll(0):
            return False
        return bool(conn.recv(1, socket.MSG_PEEK) == b"")
    except OSError:
        return True


def default_socket_dir() -> str:
    return os.environ.get("PROBING_SOCKET_DIR") or f"/tmp/probing-{os.geteuid()}"


def _prepare_socket_dir(path: str) -> None:
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


def peer_credentials(conn: socket.socket) -> Tuple[int, int, int]:
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
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
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


class AgentServer:
    """One listening socket, its accept thread, and the connections it serves."""

    def __init__(self, listener: socket.socket, path: str) -> None:
        self.listener = listener
        self.path = path
        self.owner_pid = os.getpid()
        self.started_at = time.time()
        # Idents of the agent's own threads (accept, connections, eval workers).
        self.own_threads: Set[int] = set()
        self._connections: Set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self._connection_count = 0
        # Set by the detach request; acted on after its reply has been sent.
        self.stop_after_reply = False

    @classmethod
    def bind(cls, socket_dir: Optional[str] = None) -> AgentServer:
        directory = socket_dir or default_socket_dir()
        _prepare_socket_dir(directory)
        path = os.path.join(directory, f"{os.getpid()}.sock")
        if len(os.fsencode(path)) > _SOCKET_PATH_MAX:
            raise OSError(errno.ENAMETOOLONG, f"socket path {path!r} is too long for AF_UNIX")
        # A file left here belongs to an earlier process with our PID (killed with SIGKILL):
        # the directory is ours alone, so it is safe to replace.
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.bind(path)
            # chmod after bind rather than umask: umask is process-wide and the target's
            # other threads may be creating files right now. The 0700 directory closes the gap.
            os.chmod(path, 0o600)
            listener.listen(MAX_CONNECTIONS)
        except BaseException:
            listener.close()
            raise
        return cls(listener, path)

    def start(self) -> None:
        atexit.register(self._remove_socket_file)
        self._thread = threading.Thread(target=self._accept_loop, name=AGENT_THREAD_NAME, daemon=True)
        self._thread.start()

    def serving(self) -> bool:
        return not self._stopping and self._thread is not None and self._thread.is_alive()

    # --- accepting --------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        self.own_threads.add(threading.get_ident())
        try:
            remove_dead_sockets(os.path.dirname(self.path))
            while not self._stopping:
                try:
                    conn, _ = self.listener.accept()
                except OSError as error:
                    if self._stopping or error.errno in (errno.EBADF, errno.EINVAL):
                        return
                    # Out of descriptors or memory: back off instead of spinning.
                    time.sleep(0.1)
                    continue
                if self._stopping:
                    conn.close()
                    return
                self._admit(conn)
        finally:
            self.own_threads.discard(threading.get_ident())

    def _admit(self, conn: socket.socket) -> None:
        try:
            _, uid, _ = peer_credentials(conn)
        except OSError:
            conn.close()
            return
        if uid not in (0, os.geteuid()):
            self._refuse(conn, "PermissionDenied", f"uid {uid} may not talk to this agent")
            return
        with self._connections_lock:
            if len(self._connections) >= MAX_CONNECTIONS:
                busy = True
            else:
                busy = False
                self._connections.add(conn)
                self._connection_count += 1
                number = self._connection_count
        if busy:
            self._refuse(conn, "Busy", f"the agent already serves {MAX_CONNECTIONS} clients")
            return
        thread = threading.Thread(
            target=self._serve_connection, args=(conn,), name=f"probing-conn-{number}", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # can't start new thread
            self._forget(conn)
            conn.close()

    def _refuse(self, conn: socket.socket, error_type: str, message: str) -> None:
        from .. import protocol

        try:
            conn.settimeout(1.0)
            protocol.send_frame(conn, protocol.error_reply(None, error_type, message))
        except OSError:
            pass
        finally:
            conn.close()

    def _forget(self, conn: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(conn)

    # --- serving one client ------------------------------------------------------------------

    def _serve_connection(self, conn: socket.socket) -> None:
        self.own_threads.add(threading.get_ident())
        _serving.connection = conn
        dispatcher: Any = None
        try:
            from .. import protocol

            try:
                from .handlers import Dispatcher
            except Exception as error:  # noqa: BLE001 - a broken install: say so, don't vanish
                message = f"the agent cannot load its request handlers: {type(error).__name__}: {error}"
                self._send(conn, protocol.frame_buffers(protocol.error_reply(None, "InternalError", message)))
                return
            dispatcher = Dispatcher(self)
            reader = protocol.FrameReader(conn, protocol.MAX_REQUEST_BYTES)
            conn.settimeout(IDLE_TIMEOUT_S)
            # Replies to pipelined requests (hello + backtrace) leave in one send: in a busy
            # process every socket call costs up to a GIL switch interval to come back from.
            outgoing: List[protocol.ByteChunk] = []
            while not self._stopping:
                try:
                    frame = reader.read()
                except protocol.FrameError as error:
                    reply = protocol.error_reply(error.request_id, "BadFrame", str(error))
                    outgoing += protocol.frame_buffers(reply)
                    if not self._send(conn, outgoing) or error.fatal:
                        return
                    outgoing = []
                    continue
                except (protocol.ConnectionClosed, OSError):
                    return
                if frame is None:
                    return
                reply, payload = dispatcher.handle(frame)
                outgoing += protocol.frame_buffers(reply, payload)
                if reader.has_frame():
                    continue
                # A client that went away must cost us nothing more than this connection.
                if not self._send(conn, outgoing):
                    return
                outgoing = []
                if self.stop_after_reply:
                    from . import stop

                    stop()
                    return
        except Exception:  # noqa: BLE001 - a broken connection must never take the agent down
            return
        finally:
            self._forget(conn)
            try:
                conn.close()
            except OSError:
                pass
            if dispatcher is not None:
                try:
                    dispatcher.close()
                except Exception:  # noqa: BLE001, S110 - closing must not take the agent down
                    pass
            self.own_threads.discard(threading.get_ident())

    @staticmethod
    def _send(conn: socket.socket, buffers: Any) -> bool:
        from .. import protocol

        try:
            protocol.send_buffers(conn, buffers)
            return True
        except OSError:
            return False

    # --- stopping -----------------------------------------------------------------------------

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._wake_accept()
        # shutdown() wakes a thread blocked in accept() without freeing the descriptor: closing
        # it first could let a new agent's listener reuse the number while the old accept thread
        # is still about to call accept() on it, and take that agent's first client.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        thread = self._thread
        if thread is not None and thread.ident != threading.get_ident():
            thread.join(timeout=1.0)
        try:
            self.listener.close()
        except OSError:
            pass
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        memory = sys.modules.get(__package__ + ".memory")
        if memory is not None:
            memory.stop_sampling()
        growth = sys.modules.get(__package__ + ".growth")
        if growth is not None:
            growth.cancel()
        # Before the streams go back: an interrupted statement's last words stay captured.
        repl = sys.modules.get(__package__ + ".repl")
        if repl is not None:
            repl.drop_all()
        output = sys.modules.get(__package__ + ".output")
        if output is not None:
            output.uninstall()
        torchtrace = sys.modules.get(__package__ + ".torchtrace")
        tracer = torchtrace.current() if torchtrace is not None else None
        if tracer is not None:
            tracer.uninstall()
        # Last: `probing PID detach` returns when the socket file is gone, and an agent attached
        # right after must not have its sampler or hooks undone by the rest of this stop().
        self._remove_socket_file()
        atexit.unregister(self._remove_socket_file)

    def _wake_accept(self) -> None:
        # Closing a socket does not wake a thread blocked in accept() on it; a connection does.
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as waker:
                waker.settimeout(0.5)
                waker.connect(self.path)
        except OSError:
            pass

    def _remove_socket_file(self) -> None:
        if os.getpid() != self.owner_pid:
            return  # a forked child must never remove its parent's socket
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except OSError:
            pass

    def abandon_in_child(self) -> None:
        """After fork, in the child: close our copies of the parent's sockets, touch nothing else.

        close() on a copied descriptor only drops the child's reference; the parent keeps
        listening. A client connected to the parent would otherwise not see its connection
        close until every forked DataLoader worker exited too.
        """
        self._stopping = True
        for sock in [self.listener, *self._connections]:
            try:
                sock.close()
            except OSError:
                pass
        self._connections = set()
