"""The TCP listener: one thread, a selector over the listening socket and the handshakes in
progress; an authenticated connection is handed to the agent's server like a Unix-socket client.

A peer that has not proved the token gets no thread and no method (not even hello): its bytes
are read by the selector, at most RESPONSE_BYTES of them, and never parsed as a request. Each
must finish the handshake within HANDSHAKE_TIMEOUT_S, and at most MAX_PENDING_HANDSHAKES wait
at once (a newcomer drops the oldest), so silent connections cannot hold the agent. Idle, the
thread sits in a blocking poll; it wakes on a timer only for a handshake's deadline, in a
torchrun rank to retry publishing its endpoint (0.5 s growing to 5 s, until it succeeds), and
every IDENTITY_CHECK_S to see that its descriptors are still its own.

A job may close every descriptor (os.closerange) and reuse the numbers, so the listener owns
none it cannot check: poll(), not epoll (an epoll descriptor's identity is a shared anonymous
inode's); its sockets' identities (sockets.py) are checked before use. Once one is not ours, it
stops quietly, forgetting the numbers and its store client, and says why in `hello`.
"""

from __future__ import annotations

import collections
import errno
import os
import selectors
import socket
import threading
import time
import weakref
from typing import Any, Deque, Dict, Optional, Protocol, Set

from ...protocol import auth, sealed
from ...protocol.endpoints import format_endpoint
from ..lifecycle import WORK, on_fork_in_child, on_stop
from ..sockets import descriptor_identity, release
from ..threads import AgentThread
from .address import published_endpoint
from .publisher import Publisher
from .rank import rank_identity
from .registry import Registry

LISTENER_THREAD_NAME = "probing-listener"
HANDSHAKE_TIMEOUT_S = 3.0
MAX_PENDING_HANDSHAKES = 64
# A refused peer's connection stays open this long after the verdict, its bytes discarded:
# closed with unread data, the kernel would reset it and the peer might never read why.
REFUSAL_LINGER_S = 0.2
BACKLOG = 1024  # the kernel caps it at somaxconn; a burst of connects must not stall in SYN retries
# Accepts per wake-up: a flood of connections must not starve the handshakes already waiting.
ACCEPTS_PER_WAKE = 64
# Out of descriptors, the listening socket stays readable: wait instead of spinning.
ACCEPT_PAUSE_S = 0.1
# The longest the thread sleeps without looking at its descriptors: a job that closed them and
# reused the numbers for files that never wake the poll must not keep the thread for good.
IDENTITY_CHECK_S = 30.0
LOST_DESCRIPTORS = "the TCP listener stopped: the job closed its sockets (os.closerange or the like)"


class Admitting(Protocol):
    """What the listener needs of the agent's server (server.py's AgentServer)."""

    own_threads: Set[int]

    def admit_authenticated(self, conn: socket.socket, peer: str) -> None: ...


class _Handshake:
    __slots__ = ("sock", "identity", "peer", "nonce", "received", "deadline", "refused")

    def __init__(self, sock: socket.socket, peer: str, nonce: bytes, now: float) -> None:
        self.sock = sock
        self.identity = descriptor_identity(sock)
        self.peer = peer
        self.nonce = nonce
        self.received = b""
        self.deadline = now + HANDSHAKE_TIMEOUT_S
        self.refused = False


def peer_text(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return format_endpoint(str(address[0]), address[1])
    return str(address)


class TcpListener:
    """A TCP port serving the agent's protocol to peers that prove the shared token."""

    def __init__(self, server: Admitting, sock: socket.socket, token: str) -> None:
        self.server = server
        self.sock = sock
        self.identity = descriptor_identity(sock)
        self.endpoint = published_endpoint(sock)
        self.owner_pid = os.getpid()
        self._key = auth.key_of(token)
        # Only a torchrun rank publishes its endpoint; a plain process just listens.
        self.registry: Optional[Registry] = (
            Registry(server.own_threads) if rank_identity() is not None else None
        )
        self.publisher = Publisher(self.registry, self.endpoint, server.own_threads, self._wake)
        self.failure: Optional[str] = None  # why the listener thread ended, if it did by itself
        self._pending: Deque[_Handshake] = collections.deque()
        self._selector = selectors.PollSelector()  # no descriptor of its own: see the docstring
        self._waker, self._wake_end = socket.socketpair()
        self._waker_identity = descriptor_identity(self._waker)
        self._wake_end_identity = descriptor_identity(self._wake_end)
        self._waker.setblocking(False)
        self._wake_end.setblocking(False)
        self._accept_paused_until: Optional[float] = None
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._selector.register(self.sock, selectors.EVENT_READ, None)
        self._selector.register(self._wake_end, selectors.EVENT_READ, self._wake_end)
        # Known to the fork hook before anything runs: a child forked a moment later must not
        # keep our port open.
        _started.add(self)
        on_fork_in_child(_abandon_all_in_child)
        on_stop(self.stop, WORK)
        self._thread = AgentThread(target=self._run, name=LISTENER_THREAD_NAME, daemon=True)
        self._thread.start()
        self.server.own_threads.add(self._thread.ident or 0)

    def running(self) -> bool:
        """Serving: its thread runs and its descriptors are still its sockets (a job that closes
        every descriptor, os.closerange(3, ...), closes ours too)."""
        if self._stopping or self._thread is None or not self._thread.is_alive():
            return False
        return self._descriptors_ours()

    def _descriptors_ours(self) -> bool:
        return (
            descriptor_identity(self.sock) == self.identity
            and descriptor_identity(self._wake_end) == self._wake_end_identity
            and descriptor_identity(self._waker) == self._waker_identity
        )

    @property
    def registered(self) -> bool:
        return self.publisher.registered

    @property
    def registry_error(self) -> Optional[str]:
        return self.publisher.error

    def describe(self) -> Dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "registered": self.publisher.registered,
            "registry_error": self.publisher.error,
        }

    # --- the loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        own = self.server.own_threads
        own.add(threading.get_ident())
        try:
            while not self._stopping:
                events = self._selector.select(self._timeout(time.monotonic()))
                if not self._descriptors_ours():
                    self._lose_descriptors()
                    break
                for key, _ in events:
                    if self._stopping:
                        break
                    if key.data is None:
                        self._accept_some()
                    elif key.data is self._wake_end:
                        self._drain_wakes()
                    else:
                        self._read_response(key.data)
                now = time.monotonic()
                self._expire(now)
                self._maybe_resume_accepting(now)
                self.publisher.maybe_start(now)
        except Exception as error:  # noqa: BLE001 - the listener failing must never reach the job
            self.failure = f"the TCP listener stopped: {type(error).__name__}: {error}"
        finally:
            if os.getpid() == self.owner_pid:
                self._close_everything()
            own.discard(threading.get_ident())

    def _timeout(self, now: float) -> float:
        deadlines = [entry.deadline for entry in self._pending]
        deadlines.append(now + IDENTITY_CHECK_S)
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        due = self.publisher.due_at()
        if due is not None:
            deadlines.append(due)
        return max(0.0, min(deadlines) - now)

    def _accept_some(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                conn, address = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._selector.unregister(self.sock)
                    self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
                    return
                raise
            self._begin_handshake(conn, peer_text(address))

    def _maybe_resume_accepting(self, now: float) -> None:
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self.sock, selectors.EVENT_READ, None)

    def _begin_handshake(self, conn: socket.socket, peer: str) -> None:
        conn.setblocking(False)
        if len(self._pending) >= MAX_PENDING_HANDSHAKES:
            self._drop(self._pending[0])
        nonce, challenge = auth.challenge()
        entry = _Handshake(conn, peer, nonce, time.monotonic())
        self._pending.append(entry)
        self._selector.register(conn, selectors.EVENT_READ, entry)
        try:
            sent = conn.send(challenge)
        except OSError:
            sent = 0
        if sent != len(challenge):  # a fresh socket's buffer takes 40 bytes; else it is broken
            self._drop(entry)

    def _read_response(self, entry: _Handshake) -> None:
        if descriptor_identity(entry.sock) != entry.identity:
            self._drop(entry)  # the job closed it: its number may be the job's file now
            return
        want = 4096 if entry.refused else auth.RESPONSE_BYTES - len(entry.received)
        try:
            data = entry.sock.recv(want)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(entry)
            return
        if entry.refused:
            return  # a refused peer's bytes are discarded unread, whatever they are
        entry.received += data
        if len(entry.received) < auth.RESPONSE_BYTES:
            return
        accepted, verdict = auth.verdict(self._key, entry.nonce, entry.received)
        try:
            entry.sock.send(verdict)
        except OSError:
            self._drop(entry)
            return
        if not accepted:
            entry.refused = True
            entry.deadline = time.monotonic() + REFUSAL_LINGER_S
            try:
                entry.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._drop(entry)
            return
        # Authenticated: from here on it is a client like any on the Unix socket. Whatever it
        # sent after its RESPONSE (a pipelined hello) is still unread in the kernel's buffer.
        self._selector.unregister(entry.sock)
        self._pending.remove(entry)
        entry.sock.setblocking(True)
        try:
            entry.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        # Every byte from here on travels in records sealed under this connection's own key
        # (protocol/sealed.py): a relay that passed the handshake along can inject nothing.
        session_key = auth.session_key(self._key, entry.nonce, entry.received)
        self.server.admit_authenticated(
            sealed.SealedSocket(entry.sock, session_key, sealed.AGENT), entry.peer
        )

    def _expire(self, now: float) -> None:
        for entry in [entry for entry in self._pending if entry.deadline <= now]:
            self._drop(entry)

    def _drop(self, entry: _Handshake) -> None:
        try:
            self._selector.unregister(entry.sock)
        except (KeyError, ValueError, OSError):
            pass
        try:
            self._pending.remove(entry)
        except ValueError:
            pass
        release(entry.sock, entry.identity)

    # --- stopping ------------------------------------------------------------------------------

    def _wake(self) -> None:
        if descriptor_identity(self._waker) != self._waker_identity:
            return  # the job closed it: the number may be the job's socket now
        try:
            self._waker.send(b"\0")
        except OSError:
            pass  # full (a wake is pending anyway) or closed (stopped)

    def _drain_wakes(self) -> None:
        if descriptor_identity(self._wake_end) != self._wake_end_identity:
            return
        try:
            self._wake_end.recv(4096)
        except OSError:
            pass

    def _lose_descriptors(self) -> None:
        """The job closed our descriptors: stop, touching neither them nor the store."""
        self._stopping = True
        self.failure = LOST_DESCRIPTORS
        self.publisher.abandon()

    def stop(self) -> None:
        """Close the port and every handshake in progress (detach); unpublish the endpoint."""
        if self._stopping:
            return
        ours = self._descriptors_ours()
        if not ours:
            self._lose_descriptors()
        self._stopping = True
        self.publisher.stop()
        thread = self._thread
        if not ours:  # no waker: it ends at its next wake-up; the numbers are forgotten now
            self._close_everything()
            return
        self._wake()
        if thread is not None and thread.ident != threading.get_ident():
            thread.join(timeout=2.0)
        if thread is None:  # never started; a thread closes everything itself as it ends
            self._close_everything()

    def _close_everything(self) -> None:
        for entry in list(self._pending):
            release(entry.sock, entry.identity)
        self._pending.clear()
        try:
            self._selector.close()
        except OSError:
            pass
        release(self.sock, self.identity)
        release(self._waker, self._waker_identity)
        release(self._wake_end, self._wake_end_identity)

    def abandon_in_child(self) -> None:
        """After fork, in the child: close our copies of the parent's sockets, nothing more (the
        parent goes on listening)."""
        if os.getpid() == self.owner_pid or self._stopping:
            return
        self._stopping = True
        for entry in list(self._pending):
            release(entry.sock, entry.identity)
        self._pending.clear()
        release(self.sock, self.identity)
        release(self._waker, self._waker_identity)
        release(self._wake_end, self._wake_end_identity)
        self.publisher.forget()


# Listeners of this process, for the one fork hook that abandons them all in a child: a hook per
# listener would keep every stopped one alive for good (attach and detach may cycle for days).
_started: weakref.WeakSet[TcpListener] = weakref.WeakSet()


def _abandon_all_in_child() -> None:
    for listener in list(_started):
        listener.abandon_in_child()
