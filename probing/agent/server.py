"""The agent's socket: bind, accept, check the peer, one thread per client connection.

Idle cost is zero: the accept thread and every connection thread sit in blocking system
calls; nothing polls. Request handling (and the protocol's frames and tables it needs) is
loaded on the first connection, so an agent nobody talks to costs one thread and one file
descriptor.
"""

from __future__ import annotations

import atexit
import errno
import os
import socket
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set

from ..originals import Socket, allocate_lock, get_ident, monotonic, sleep, wall_time
from ..protocol.messages import ErrorKind, error_reply
from .connections import Connection, busy_message, serve_on_this_thread
from .lifecycle import run_stop_hooks
from .sockets import (
    AGENT_THREAD_NAME,
    accept,
    bind_listener,
    descriptor_identity,
    peer_credentials,
    release,
    remove_dead_sockets,
    remove_socket_file,
)
from .threads import AgentThread

if TYPE_CHECKING:
    from ..protocol.frames import ByteChunk
    from .listener.acceptor import TcpListener
    from .listener.registry import Registry

__all__ = ["AGENT_THREAD_NAME", "AgentServer"]

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


class AgentServer:
    """One listening socket, its accept thread, and the connections it serves."""

    def __init__(self, listener: Socket, path: str) -> None:
        self.listener = listener
        self.listener_identity = descriptor_identity(listener)
        self.path = path
        self.owner_pid = os.getpid()
        self.started_at = wall_time()
        # Idents of the agent's own threads (accept, connections, eval workers).
        self.own_threads: Set[int] = set()
        self._connections: Dict[Socket, Connection] = {}
        self._connections_lock = allocate_lock()
        self._thread: Optional[AgentThread] = None
        self._stopping = False
        self._connection_count = 0
        # Set by the detach request; acted on after its reply has been sent.
        self.stop_after_reply = False
        # What a detach calls once its reply is out: the package's stop(), which also forgets
        # this server (agent/__init__.py sets it; the server never imports its package).
        self.on_detach: Callable[[], None] = self.stop
        # The TCP side (issue 14), set by agent/__init__.py or a `listen` request: the listener
        # if one serves, why PROBING_LISTEN did not start one, and the job's store client.
        self.tcp_listener: Optional[TcpListener] = None
        self.listen_error: Optional[str] = None
        self.registry: Optional[Registry] = None

    @classmethod
    def bind(cls, socket_dir: Optional[str] = None) -> AgentServer:
        listener, path = bind_listener(socket_dir, MAX_CONNECTIONS)
        return cls(listener, path)

    def start(self) -> None:
        atexit.register(self._remove_socket_file)
        self._thread = AgentThread(target=self._accept_loop, name=AGENT_THREAD_NAME)
        self._thread.start()

    @property
    def accept_thread_id(self) -> Optional[int]:
        """The OS thread id of the accept thread, once started."""
        return self._thread.native_id if self._thread is not None else None

    def serving(self) -> bool:
        return not self._stopping and self._thread is not None and self._thread.is_alive()

    # --- accepting --------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        self.own_threads.add(get_ident())
        try:
            remove_dead_sockets(os.path.dirname(self.path))
            while not self._stopping:
                try:
                    conn, _ = accept(self.listener)
                except OSError as error:
                    if self._stopping or error.errno in (errno.EBADF, errno.EINVAL, errno.ENOTSOCK):
                        return
                    if descriptor_identity(self.listener) != self.listener_identity:
                        return  # the job closed our socket and reused the number
                    # Out of descriptors or memory: back off instead of spinning.
                    sleep(0.1)
                    continue
                if self._stopping:
                    release(conn, descriptor_identity(conn))
                    return
                self._admit(conn)
        finally:
            self.own_threads.discard(get_ident())

    def _admit(self, conn: Socket) -> None:
        try:
            pid, uid, _ = peer_credentials(conn)
        except OSError:
            release(conn, descriptor_identity(conn))
            return
        if uid not in (0, os.geteuid()):
            self._refuse(conn, ErrorKind.PERMISSION_DENIED, f"uid {uid} may not talk to this agent")
            return
        self._admit_checked(Connection(conn, pid))

    def admit_authenticated(self, conn: Socket, peer: str) -> None:
        """A TCP client that proved the token (listener/): the token stands in for the peer's
        uid, and from here on it is served like any Unix-socket client, under the same cap."""
        if self._stopping:
            release(conn, descriptor_identity(conn))
            return
        self._admit_checked(Connection(conn, None, peer))

    def _admit_checked(self, record: Connection) -> None:
        conn = record.sock
        refused: Optional[List[Dict[str, Any]]] = None
        with self._connections_lock:
            if len(self._connections) >= MAX_CONNECTIONS:
                idle = [other for other in self._connections.values() if other.busy_since is None]
                if idle:
                    self._evict(min(idle, key=Connection.eviction_order))
                else:
                    now = monotonic()
                    refused = [other.describe(now) for other in self._connections.values()]
            if refused is None:
                self._connections[conn] = record
                self._connection_count += 1
                number = self._connection_count
        if refused is not None:
            self._refuse(
                conn, ErrorKind.BUSY, busy_message(refused), busy=len(refused), idle=0, connections=refused
            )
            return
        thread = AgentThread(
            target=self._serve_connection, args=(conn, record), name=f"probing-conn-{number}"
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

    def _refuse(self, conn: Socket, error_type: str, message: str, **details: Any) -> None:
        from ..protocol.frames import send_frame

        identity = descriptor_identity(conn)
        try:
            conn.settimeout(1.0)
            send_frame(conn, error_reply(None, error_type, message, **details))
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

    def _forget(self, conn: Socket) -> None:
        with self._connections_lock:
            self._connections.pop(conn, None)

    def _start_request(self, record: Connection, header: Dict[str, Any]) -> bool:
        """Mark the connection busy; False when it was evicted (its request must not run)."""
        method = header.get("method")
        with self._connections_lock:
            if record.evicted:
                return False
            if record.busy_since is None:
                record.busy_since = monotonic()
            record.method = method[:64] if isinstance(method, str) else None
            return True

    def _end_request(self, record: Connection) -> None:
        with self._connections_lock:
            record.requests += 1
            record.last_request_at = monotonic()
            record.busy_since = None

    def connections(self) -> List[Dict[str, Any]]:
        """Who holds the agent's connections now (for a Busy reply and for tests)."""
        now = monotonic()
        with self._connections_lock:
            return [record.describe(now) for record in self._connections.values()]

    # --- serving one client ------------------------------------------------------------------

    def _serve_connection(self, conn: Socket, record: Optional[Connection] = None) -> None:
        self.own_threads.add(get_ident())
        serve_on_this_thread(conn)
        if record is None:  # a connection handed over directly (tests over a socketpair)
            record = Connection(conn, 0)
            with self._connections_lock:
                self._connections[conn] = record
        dispatcher: Any = None
        try:
            from ..protocol.frames import frame_buffers

            try:
                from .handlers import Dispatcher, reply_buffers
            except Exception as error:  # noqa: BLE001 - a broken install: say so, don't vanish
                message = f"the agent cannot load its request handlers: {type(error).__name__}: {error}"
                self._send(
                    conn,
                    frame_buffers(error_reply(None, ErrorKind.INTERNAL_ERROR, message)),
                )
                return
            dispatcher = Dispatcher(self)
            self._serve_requests(conn, record, dispatcher, reply_buffers)
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
            self.own_threads.discard(get_ident())

    def _serve_requests(self, conn: Socket, record: Connection, dispatcher: Any, reply_buffers: Any) -> None:
        """Read requests and send replies until the client leaves, a frame is bad past
        repair, the connection is evicted or the agent stops."""
        from ..protocol import frames

        reader = frames.FrameReader(conn, frames.MAX_REQUEST_BYTES)
        # Replies to pipelined requests (hello + backtrace) leave in one send: in a busy
        # process every socket call costs up to a GIL switch interval to come back from.
        outgoing: List[ByteChunk] = []
        while not self._stopping:
            first = record.requests == 0
            deadline = record.connected_at + HELLO_TIMEOUT_S if first else None
            # A job that closed every descriptor (os.closerange) may have this number for a
            # socket of its own by now: settimeout() would make it non-blocking under it.
            if descriptor_identity(conn) != record.identity:
                return
            try:
                if not outgoing:
                    conn.settimeout(IDLE_TIMEOUT_S)  # read each time: a test shortens it
                frame = reader.read(deadline, FRAME_TIMEOUT_S)
            except frames.FrameTimeout as error:
                why = f"no request within {HELLO_TIMEOUT_S:g} s of connecting" if first else str(error)
                outgoing += frames.frame_buffers(error_reply(None, ErrorKind.TIMEOUT, why))
                self._send(conn, outgoing)
                return
            except frames.FrameError as error:
                reply = error_reply(error.request_id, ErrorKind.BAD_FRAME, str(error))
                outgoing += frames.frame_buffers(reply)
                if not self._send(conn, outgoing) or error.fatal:
                    return
                outgoing = []
                continue
            except (frames.ConnectionClosed, OSError):
                return
            if frame is None:
                return
            if not self._start_request(record, frame.header):
                return  # evicted while the request came in: it never runs
            reply, payload = dispatcher.handle(frame)
            outgoing += reply_buffers(reply, payload)
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
                self.on_detach()
                return

    @staticmethod
    def _send(conn: Socket, buffers: Any) -> bool:
        from ..protocol.frames import send_buffers

        try:
            conn.settimeout(SEND_TIMEOUT_S)
            send_buffers(conn, buffers)
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
        if thread is not None and thread.ident != get_ident():
            thread.join(timeout=1.0)
        release(self.listener, self.listener_identity)
        # The TCP port closes before the connections do: a client that sees its connection end
        # after a detach finds the port closed too (its stop hook below is then a no-op).
        if self.tcp_listener is not None:
            self.tcp_listener.stop()
        with self._connections_lock:
            for record in self._connections.values():
                release(record.sock, record.identity, socket.SHUT_RDWR)
        # Each feature undoes what it started, stage by stage (lifecycle.py): work on the agent's
        # behalf, then sessions (before the streams go back: an interrupted statement's last
        # words stay captured), then the streams, then hooks inside the job's libraries.
        run_stop_hooks()
        # Last: `probing PID detach` returns when the socket file is gone, and an agent attached
        # right after must not have its sampler or hooks undone by the rest of this stop().
        self._remove_socket_file()
        atexit.unregister(self._remove_socket_file)

    def _wake_accept(self) -> None:
        # Closing a socket does not wake a thread blocked in accept() on it; a connection does.
        waker = Socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            waker.settimeout(0.5)
            waker.connect(self.path)
        except OSError:
            pass
        finally:
            waker.close()

    def _remove_socket_file(self) -> None:
        if os.getpid() != self.owner_pid:
            return  # a forked child must never remove its parent's socket
        remove_socket_file(self.path)

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
