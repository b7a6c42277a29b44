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
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

if TYPE_CHECKING:
    from .. import protocol

AGENT_THREAD_NAME = "probing-agent"
# A connection that sends nothing for this long between requests is closed, so a stalled
# client cannot pin a thread in the target forever (a repl reconnects on its next line).
IDLE_TIMEOUT_S = 600.0
# A new connection must deliver its first request whole within this time: every client
# sends its hello (with its first request) right after connecting.
HELLO_TIMEOUT_S = 5.0
# A frame, once its first byte is in, must arrive whole within this time (a slowloris peer
# that trickles a byte a second would otherwise hold its slot for ever).
FRAME_TIMEOUT_S = 15.0
# A reply the client takes nothing of for this long ends the connection: a peer that
# pipelines requests and never reads must not pin a connection thread in send().
SEND_TIMEOUT_S = 10.0
# Connection threads at once. When all are taken, a newcomer takes the slot of the idle
# connection that has waited longest (never-greeted ones first); only connections running
# a request keep theirs, so silent or slow peers can never lock a real client out.
MAX_CONNECTIONS = 16
# How long a refused connection stays open for the request its client sends with its hello.
REFUSAL_LINGER_S = 0.2
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


def descriptor_identity(sock: socket.socket) -> Optional[Tuple[int, int]]:
    """(st_dev, st_ino) of what the socket's descriptor number refers to now; None if closed."""
    try:
        info = os.fstat(sock.fileno())
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


def release(sock: socket.socket, identity: Optional[Tuple[int, int]], shutdown: Optional[int] = None) -> None:
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


class Connection:
    """What the agent knows of one client connection: who, since when, doing what.

    `busy_since` is set from the moment a whole request has been read until its reply is
    sent; only then is the connection not evictable. All fields change under the server's
    connections lock.
    """

    __slots__ = (
        "sock",
        "identity",
        "pid",
        "connected_at",
        "requests",
        "last_request_at",
        "method",
        "busy_since",
        "evicted",
    )

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.identity = descriptor_identity(sock)
        self.pid = pid
        self.connected_at = time.monotonic()
        self.requests = 0
        self.last_request_at = self.connected_at
        self.method: Optional[str] = None
        self.busy_since: Optional[float] = None
        self.evicted = False

    def eviction_order(self) -> Tuple[bool, float]:
        # Peers that never completed a request go first (silent or slowloris), then the one
        # whose last request ended longest ago.
        return self.requests > 0, self.last_request_at

    def describe(self, now: float) -> Dict[str, Any]:
        busy = self.busy_since is not None
        return {
            "pid": self.pid,
            "state": "busy" if busy else "idle",
            "method": self.method if busy else None,
            "age_s": round(now - self.connected_at, 3),
            "busy_s": round(now - self.busy_since, 3) if self.busy_since is not None else None,
            "requests": self.requests,
        }


def _busy_message(described: List[Dict[str, Any]]) -> str:
    running = ", ".join(
        f"{entry['method']} for {entry['busy_s']:.1f} s (PID {entry['pid']})" for entry in described[:8]
    )
    more = f" and {len(described) - 8} more" if len(described) > 8 else ""
    return (
        f"the agent serves {len(described)} connections, all running a request: {running}{more}; "
        "try again when one of them ends"
    )


class AgentServer:
    """One listening socket, its accept thread, and the connections it serves."""

    def __init__(self, listener: socket.socket, path: str) -> None:
        self.listener = listener
        self.listener_identity = descriptor_identity(listener)
        self.path = path
        self.owner_pid = os.getpid()
        self.started_at = time.time()
        # Idents of the agent's own threads (accept, connections, eval workers).
        self.own_threads: Set[int] = set()
        self._connections: Dict[socket.socket, Connection] = {}
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
                    if self._stopping or error.errno in (errno.EBADF, errno.EINVAL, errno.ENOTSOCK):
                        return
                    if descriptor_identity(self.listener) != self.listener_identity:
                        return  # the job closed our socket and reused the number
                    # Out of descriptors or memory: back off instead of spinning.
                    time.sleep(0.1)
                    continue
                if self._stopping:
                    release(conn, descriptor_identity(conn))
                    return
                self._admit(conn)
        finally:
            self.own_threads.discard(threading.get_ident())

    def _admit(self, conn: socket.socket) -> None:
        try:
            pid, uid, _ = peer_credentials(conn)
        except OSError:
            release(conn, descriptor_identity(conn))
            return
        if uid not in (0, os.geteuid()):
            self._refuse(conn, "PermissionDenied", f"uid {uid} may not talk to this agent")
            return
        record = Connection(conn, pid)
        refused: Optional[List[Dict[str, Any]]] = None
        with self._connections_lock:
            if len(self._connections) >= MAX_CONNECTIONS:
                idle = [other for other in self._connections.values() if other.busy_since is None]
                if idle:
                    self._evict(min(idle, key=Connection.eviction_order))
                else:
                    now = time.monotonic()
                    refused = [other.describe(now) for other in self._connections.values()]
            if refused is None:
                self._connections[conn] = record
                self._connection_count += 1
                number = self._connection_count
        if refused is not None:
            self._refuse(conn, "Busy", _busy_message(refused), busy=len(refused), idle=0, connections=refused)
            return
        thread = threading.Thread(
            target=self._serve_connection, args=(conn, record), name=f"probing-conn-{number}", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # can't start new thread
            self._forget(conn)
            release(conn, record.identity)

    def _evict(self, record: Connection) -> None:
        """Close an idle connection to make room (the connections lock is held).

        Its thread, blocked in recv(), wakes to an end of stream and closes the socket; a
        request that arrived meanwhile is dropped unread, never run, so a client that sees
        the connection close can safely send it again (the repl does).
        """
        record.evicted = True
        del self._connections[record.sock]
        release(record.sock, record.identity, socket.SHUT_RDWR)

    def _refuse(self, conn: socket.socket, error_type: str, message: str, **details: Any) -> None:
        from .. import protocol

        identity = descriptor_identity(conn)
        try:
            conn.settimeout(1.0)
            protocol.send_frame(conn, protocol.error_reply(None, error_type, message, **details))
            # Closed at once, the client's send of its first request (right after connect())
            # could fail with EPIPE before it reads why: let that request arrive first. One
            # recv, which returns as soon as anything is there, for at most REFUSAL_LINGER_S.
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(REFUSAL_LINGER_S)
            conn.recv(1 << 16)
        except OSError:
            pass
        finally:
            release(conn, identity)

    def _forget(self, conn: socket.socket) -> None:
        with self._connections_lock:
            self._connections.pop(conn, None)

    def _start_request(self, record: Connection, header: Dict[str, Any]) -> bool:
        """Mark the connection busy; False when it was evicted (its request must not run)."""
        method = header.get("method")
        with self._connections_lock:
            if record.evicted:
                return False
            if record.busy_since is None:
                record.busy_since = time.monotonic()
            record.method = method[:64] if isinstance(method, str) else None
            return True

    def _end_request(self, record: Connection) -> None:
        with self._connections_lock:
            record.requests += 1
            record.last_request_at = time.monotonic()
            record.busy_since = None

    def connections(self) -> List[Dict[str, Any]]:
        """Who holds the agent's connections now (for a Busy reply and for tests)."""
        now = time.monotonic()
        with self._connections_lock:
            return [record.describe(now) for record in self._connections.values()]

    # --- serving one client ------------------------------------------------------------------

    def _serve_connection(self, conn: socket.socket, record: Optional[Connection] = None) -> None:
        self.own_threads.add(threading.get_ident())
        _serving.connection = conn
        if record is None:  # a connection handed over directly (tests over a socketpair)
            record = Connection(conn, 0)
            with self._connections_lock:
                self._connections[conn] = record
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
            # Replies to pipelined requests (hello + backtrace) leave in one send: in a busy
            # process every socket call costs up to a GIL switch interval to come back from.
            outgoing: List[protocol.ByteChunk] = []
            while not self._stopping:
                first = record.requests == 0
                deadline = record.connected_at + HELLO_TIMEOUT_S if first else None
                try:
                    if not outgoing:
                        conn.settimeout(IDLE_TIMEOUT_S)  # read each time: a test shortens it
                    frame = reader.read(deadline, FRAME_TIMEOUT_S)
                except protocol.FrameTimeout as error:
                    why = f"no request within {HELLO_TIMEOUT_S:g} s of connecting" if first else str(error)
                    outgoing += protocol.frame_buffers(protocol.error_reply(None, "Timeout", why))
                    self._send(conn, outgoing)
                    return
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
                if not self._start_request(record, frame.header):
                    return  # evicted while the request came in: it never runs
                reply, payload = dispatcher.handle(frame)
                outgoing += _reply_buffers(reply, payload)
                if reader.has_frame():
                    continue
                # Busy until the reply is out: eviction must never cut off a reply of a
                # request that ran.
                sent = self._send(conn, outgoing)
                self._end_request(record)
                # A client that went away must cost us nothing more than this connection.
                if not sent:
                    return
                outgoing = []
                if self.stop_after_reply:
                    from . import stop

                    stop()
                    return
        except Exception:  # noqa: BLE001 - a broken connection must never take the agent down
            return
        finally:
            # Closed under the lock that eviction and stop() hold while they shut a connection
            # down: neither can hit a descriptor number this close has freed for reuse.
            with self._connections_lock:
                self._connections.pop(conn, None)
                release(conn, record.identity)
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
            conn.settimeout(SEND_TIMEOUT_S)
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
        release(self.listener, self.listener_identity, socket.SHUT_RDWR)
        thread = self._thread
        if thread is not None and thread.ident != threading.get_ident():
            thread.join(timeout=1.0)
        release(self.listener, self.listener_identity)
        with self._connections_lock:
            for record in self._connections.values():
                release(record.sock, record.identity, socket.SHUT_RDWR)
        # Eval's exit guards and the interrupts it keeps sending to code that will not stop.
        evaluate = sys.modules.get(__package__ + ".evaluate.evaluation")
        if evaluate is not None:
            evaluate.stop()
        memory = sys.modules.get(__package__ + ".memory.census")
        if memory is not None:
            memory.stop_sampling()
        growth = sys.modules.get(__package__ + ".memory.growth")
        if growth is not None:
            growth.cancel()
        # Before the streams go back: an interrupted statement's last words stay captured.
        repl = sys.modules.get(__package__ + ".repl.session")
        if repl is not None:
            repl.drop_all()
        output = sys.modules.get(__package__ + ".output")
        if output is not None:
            output.uninstall()
        safepoint = sys.modules.get(__package__ + ".pytorch.safepoint")
        if safepoint is not None:
            safepoint.stop()
        torchtrace = sys.modules.get(__package__ + ".pytorch.tracer")
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
        release(self.listener, self.listener_identity)
        for record in self._connections.values():
            release(record.sock, record.identity)
        self._connections = {}


def _reply_buffers(reply: Dict[str, Any], payload: Any) -> List[Any]:
    """The frame of a reply; one whose header would pass the cap that every reader enforces
    becomes an error reply that says so (the client would otherwise refuse the whole frame)."""
    from .. import protocol

    buffers = protocol.frame_buffers(reply, payload)
    size = len(buffers[0]) - protocol.PREFIX.size
    if size <= protocol.MAX_HEADER_BYTES:
        return buffers
    message = f"the reply's header of {size} bytes exceeds the cap of {protocol.MAX_HEADER_BYTES}"
    return protocol.frame_buffers(protocol.error_reply(reply.get("id"), "ReplyTooLarge", message))
