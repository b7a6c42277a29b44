"""The TCP listener: one thread, a selector over the listening socket and the handshakes in
progress; an authenticated connection is handed to the agent's server like a Unix-socket client.

A peer that has not proved the token gets no thread and no method (not even hello): its bytes
are read by the selector, at most RESPONSE_BYTES of them, and never parsed as a request. Each
must finish the handshake within HANDSHAKE_TIMEOUT_S, and only so many wait at once
(handshakes.capacity()), so silent connections cannot hold the agent. Under a flood of such peers a client
with the token still gets through (docs/decisions.md, issue 25): which handshake makes room for
a newcomer is handshakes.py's choice (fair between sources, never one that is answering); every
wake-up reads the answers that came before it accepts newcomers, and accepts at most
ACCEPTS_PER_WAKE, so neither starves the other; a peer dropped before its verdict is reset (no
TIME_WAIT left behind by a flood). Idle, the thread sits in a blocking poll; it wakes on a timer
only for a handshake's deadline, in a torchrun rank to retry publishing its endpoint (0.5 s
growing to 5 s, until it succeeds), and every IDENTITY_CHECK_S to see that its descriptors are
still its own.

A job may close every descriptor (os.closerange) and reuse the numbers, so the listener owns
none it cannot check: poll(), not epoll (an epoll descriptor's identity is a shared anonymous
inode's); its sockets' identities (sockets.py) are checked before use. Once one is not ours, it
stops quietly, forgetting the numbers and its store client, and says why in `hello`.
"""

from __future__ import annotations

import errno
import os
import socket
import weakref
from typing import Any, Dict, Optional, Protocol, Set

from ...originals import Socket, get_ident, monotonic
from ...protocol import auth, sealed
from ..lifecycle import WORK, on_fork_in_child, on_stop
from ..sockets import Poller, accept, descriptor_identity, release, reset, socket_pair
from ..threads import AgentThread
from .address import peer_text, published_endpoint
from .handshakes import REFUSED, SILENT, Handshake, PendingHandshakes, capacity, source_of
from .publisher import Publisher
from .rank import rank_identity
from .registry import Registry

LISTENER_THREAD_NAME = "probing-tcp"  # an OS name keeps 15 bytes
HANDSHAKE_TIMEOUT_S = 3.0
# A refused peer's connection stays open this long after the verdict, its bytes discarded:
# closed with unread data, the kernel would reset it and the peer might never read why.
REFUSAL_LINGER_S = 0.2
BACKLOG = 1024  # the kernel caps it at somaxconn; a burst of connects must not stall in SYN retries
# Accepts per wake-up: a flood of connections must not starve the handshakes already waiting.
ACCEPTS_PER_WAKE = 32
# Out of descriptors, the listening socket stays readable: wait instead of spinning.
ACCEPT_PAUSE_S = 0.1
# The longest the thread sleeps without looking at its descriptors: a job that closed them and
# reused the numbers for files that never wake the poll must not keep the thread for good.
IDENTITY_CHECK_S = 30.0
LOST_DESCRIPTORS = "the TCP listener stopped: the job closed its sockets (os.closerange or the like)"


class Admitting(Protocol):
    """What the listener needs of the agent's server (server.py's AgentServer)."""

    own_threads: Set[int]

    def admit_authenticated(self, conn: Socket, peer: str) -> None: ...


class TcpListener:
    """A TCP port serving the agent's protocol to peers that prove the shared token."""

    def __init__(self, server: Admitting, sock: Socket, token: str) -> None:
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
        self._pending = PendingHandshakes(capacity())
        # What became of the connections so far (in `hello`: how hard the port is knocked on).
        self.outcomes = {"accepted": 0, "authenticated": 0, "refused": 0, "dropped": 0, "turned_away": 0}
        self._selector = Poller()  # no descriptor of its own: see the docstring
        self._waker, self._wake_end = socket_pair()
        self._waker_identity = descriptor_identity(self._waker)
        self._wake_end_identity = descriptor_identity(self._wake_end)
        self._waker.setblocking(False)
        self._wake_end.setblocking(False)
        self._accept_paused_until: Optional[float] = None
        self._stopping = False
        self._thread: Optional[AgentThread] = None

    def start(self) -> None:
        self._selector.register(self.sock, None)
        self._selector.register(self._wake_end, self._wake_end)
        # Known to the fork hook before anything runs: a child forked a moment later must not
        # keep our port open.
        _started.add(self)
        on_fork_in_child(_abandon_all_in_child)
        on_stop(self.stop, WORK)
        self._thread = AgentThread(target=self._run, name=LISTENER_THREAD_NAME)
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
            "handshakes": dict(self.outcomes, **self._pending.counts()),
        }

    # --- the loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        own = self.server.own_threads
        own.add(get_ident())
        try:
            while not self._stopping:
                events = self._selector.select(self._timeout(monotonic()))
                if not self._descriptors_ours():
                    self._lose_descriptors()
                    break
                newcomers = False
                for ready in events:
                    if self._stopping:
                        break
                    if ready is None:
                        newcomers = True
                    elif ready is self._wake_end:
                        self._drain_wakes()
                    else:
                        self._read_response(ready)
                # The answers that came are read before any newcomer is accepted: a newcomer
                # may take a handshake's slot, never one whose answer is already here.
                if newcomers and not self._stopping:
                    self._accept_some()
                now = monotonic()
                self._expire(now)
                self._maybe_resume_accepting(now)
                self.publisher.maybe_start(now)
        except BaseException as error:  # noqa: BLE001 - the listener failing must never reach the job
            self.failure = f"the TCP listener stopped: {type(error).__name__}: {error}"
        finally:
            if os.getpid() == self.owner_pid:
                self._close_everything()
            own.discard(get_ident())

    def _timeout(self, now: float) -> float:
        deadlines = [now + IDENTITY_CHECK_S]
        handshake_due = self._pending.next_deadline()
        if handshake_due is not None:
            deadlines.append(handshake_due)
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        due = self.publisher.due_at()
        if due is not None:
            deadlines.append(due)
        return max(0.0, min(deadlines) - now)

    def _accept_some(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                conn, address = accept(self.sock)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._selector.unregister(self.sock)
                    self._accept_paused_until = monotonic() + ACCEPT_PAUSE_S
                    return
                raise
            self._begin_handshake(conn, address)

    def _maybe_resume_accepting(self, now: float) -> None:
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self.sock, None)

    def _begin_handshake(self, conn: Socket, address: Any) -> None:
        self.outcomes["accepted"] += 1
        identity = descriptor_identity(conn)
        source = source_of(address)
        if not self._make_room(source):
            self.outcomes["turned_away"] += 1
            reset(conn, identity)
            return
        conn.setblocking(False)
        nonce, challenge = auth.challenge()
        entry = Handshake(conn, identity, address, source, nonce, monotonic() + HANDSHAKE_TIMEOUT_S)
        self._pending.add(entry)
        self._selector.register(conn, entry)
        try:
            sent = conn.send(challenge)
        except OSError:
            sent = 0
        if sent != len(challenge):  # a fresh socket's buffer takes 40 bytes; else it is broken
            self._drop(entry)

    def _make_room(self, source: str) -> bool:
        """A slot for a newcomer from `source`, made by dropping the handshake handshakes.py
        names; False when none may go. A silent one is read first: its answer may have come
        since the last wake-up, and then it is settled by that answer instead."""
        while self._pending.full():
            victim = self._pending.victim_for(source)
            if victim is None:
                return False
            if victim.state == SILENT and self._read_response(victim):
                continue
            self._drop(victim)
        return True

    def _read_response(self, entry: Handshake) -> bool:
        """Read what `entry` sent and act on it; False when there was nothing to read."""
        if descriptor_identity(entry.sock) != entry.identity:
            self._drop(entry)  # the job closed it: its number may be the job's file now
            return True
        refused = entry.state == REFUSED
        want = 4096 if refused else auth.RESPONSE_BYTES - len(entry.received)
        try:
            data = entry.sock.recv(want)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self._drop(entry)
            return True
        if refused:
            return True  # a refused peer's bytes are discarded unread, whatever they are
        entry.received += data
        if len(entry.received) < auth.RESPONSE_BYTES:
            if not self._pending.progressing(entry):
                self._drop(entry)  # a trickler beyond its source's share
            return True
        self._give_verdict(entry)
        return True

    def _give_verdict(self, entry: Handshake) -> None:
        accepted, verdict = auth.verdict(self._key, entry.nonce, entry.received)
        try:
            entry.sock.send(verdict)
        except OSError:
            self._drop(entry)
            return
        if not accepted:
            self.outcomes["refused"] += 1
            self._pending.refused(entry, monotonic() + REFUSAL_LINGER_S)
            try:
                entry.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._drop(entry)
            return
        # Authenticated: from here on it is a client like any on the Unix socket. Whatever it
        # sent after its RESPONSE (a pipelined hello) is still unread in the kernel's buffer.
        self.outcomes["authenticated"] += 1
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
            sealed.SealedSocket(entry.sock, session_key, sealed.AGENT), peer_text(entry.address)
        )

    def _expire(self, now: float) -> None:
        for entry in self._pending.expired(now):
            self._drop(entry)

    def _drop(self, entry: Handshake) -> None:
        """Close a handshake: one that got its refusal as usual, any other with a reset."""
        try:
            self._selector.unregister(entry.sock)
        except (KeyError, ValueError, OSError):
            pass
        self._pending.remove(entry)
        if entry.state == REFUSED:
            release(entry.sock, entry.identity)
        else:
            self.outcomes["dropped"] += 1
            reset(entry.sock, entry.identity)

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
        if ours:
            # The port refuses from now on, whenever the thread gets to close it: shutdown() of a
            # listening socket stops it listening (Linux) and keeps its descriptor number ours. A
            # client whose connection the detach then ends finds the port closed, even where a
            # loaded machine does not run the thread within the join below.
            release(self.sock, self.identity, socket.SHUT_RDWR)
        thread = self._thread
        if not ours:  # no waker: it ends at its next wake-up; the numbers are forgotten now
            self._close_everything()
            return
        self._wake()
        if thread is not None and thread.ident != get_ident():
            thread.join(timeout=2.0)
        if thread is None:  # never started; a thread closes everything itself as it ends
            self._close_everything()

    def _close_everything(self) -> None:
        for entry in self._pending:
            self._pending.remove(entry)
            release(entry.sock, entry.identity)
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
        for entry in self._pending:
            self._pending.remove(entry)
            release(entry.sock, entry.identity)
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
