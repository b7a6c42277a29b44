"""The ranks of another node asked through one of that node's agents, its relay (issue 28;
agent/relay.py): the CLI holds one authenticated connection per node, not one per rank.

Every command's per-rank work is unchanged: it runs in its rank's thread (fanout.gather) and
talks to a client. A rank on a relayed node gets a RelayedClient, which looks like a Client and
hands each request to its node's NodeRelay. The relay sends what the node's ranks asked in one
`relay` request, as soon as every rank of the node still at work has asked (or BATCH_WINDOW_S
after the first did), and each rank's thread reads its own reply out of the answer with the
checks of a reply of its own (client/connection.py `_receive`).

A relay that cannot be reached before anything was sent (refused, gone, an older agent) is not
the node's ranks' failure: they are then asked directly, each over its own connection, as without
relays. A relay that fails once its request went out says so for each rank it carried: a request
may have run, and only the user may run it again. A relay that accepts and then says nothing in
time is a node that hangs: its ranks are named missing, and the rest of the command does not
wait for that node again (asked directly, each rank would keep the command waiting as long).
"""

from __future__ import annotations

import threading
import time

from ...client.connection import Client
from ...client.replies import check_result, error_from_reply
from ...errors import (
    AgentBusy,
    AgentTimeout,
    AgentUnreachable,
    BadReply,
    NoAgent,
    PermissionDenied,
    ProbingError,
    ProtocolMismatch,
    RequestRefused,
)
from ...protocol.frames import FrameError
from ...protocol.messages import parse_reply
from .job import STALE_ENDPOINT_HINT, NotTheRank, identity_mismatch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    from ...client.discovery import Log
    from .job import Rank

# How long a batch waits for its node's other ranks to ask too: until none has asked for
# BATCH_WINDOW_S, at most MAX_GATHER_S (a thousand ranks' threads take a while to start, and a
# batch gone without some leaves them for the next, after it: a `watch` window later for hang).
BATCH_WINDOW_S = 0.2
MAX_GATHER_S = 1.0
# Batches out at once, each on a connection of its own: a batch never waits for the one before
# it (a `watch`, hang's window of samples, holds its connection for the window).
MAX_BATCHES_OUT = 4
# What the relay's own work adds to the longest wait of the requests it carries.
RELAY_SLACK_S = 1.0
# A relay that answers the `relay` request itself with one of these ran none of it (an older
# agent without relays, a full agent, one that refused): its node's ranks are asked directly.
REFUSED = (RequestRefused, ProtocolMismatch, AgentBusy, PermissionDenied)
# Methods that only look: sent before the rank proved who it is, their reply read only once the
# hello that came with it did. Any other waits for a ping's hello (Target._checked's rule).
LOOKS = frozenset(("ping", "tables", "table", "backtrace", "endpoints", "watch"))


class _Asked:
    """One rank's request on its way through the relay, and what came back for it."""

    __slots__ = ("pid", "method", "params", "timeout", "answered", "entry", "payload", "error", "direct")

    def __init__(self, pid: int, method: str, params: Optional[Dict[str, Any]], timeout: float) -> None:
        self.pid, self.method, self.params, self.timeout = pid, method, params or {}, timeout
        self.answered = threading.Event()  # set once its batch came back (or failed)
        self.entry: Dict[str, Any] = {}
        self.payload = bytearray()
        self.error: Optional[ProbingError] = None
        self.direct = False  # the relay was never reached: ask the rank itself


class NodeRelay:
    """One node's relay: the endpoint of one agent of the node, the ranks of the node at work
    (`expected`), and the requests waiting to go."""

    def __init__(self, endpoint: str, node: int, expected: int, log: Log) -> None:
        self.url = f"tcp://{endpoint}"
        self.node = node
        self.log = log
        self.expected = expected
        self._lock = threading.Lock()
        self._waiting: List[_Asked] = []
        self._full = threading.Event()  # the batch being gathered has every rank at work
        self._gathering = False  # a rank's thread is gathering the next batch (its leader)
        self._last_asked = 0.0  # when a rank last asked
        self._out = threading.BoundedSemaphore(MAX_BATCHES_OUT)
        self._idle: List[Client] = []  # connections to the relay between batches
        self._opened = 0
        self.unreachable: Optional[ProbingError] = None  # refused or gone: its ranks asked directly
        self.silent: Optional[ProbingError] = None  # answered nothing in time: not asked again

    def expect(self, ranks: int) -> None:
        """A command's ranks of this node are about to ask (fanout.gather): requests wait for
        that many of them."""
        with self._lock:
            self.expected = ranks
            self._check_full()

    def finished(self) -> None:
        """A rank of the node is done asking (its client closed): the others wait for it no more."""
        with self._lock:
            self.expected -= 1
            self._check_full()

    def _check_full(self) -> None:
        if self._waiting and len(self._waiting) >= self.expected:
            self._full.set()

    def ask(self, asked: _Asked) -> None:
        """Send `asked` with its node's others; returns once its answer (or error) is in.

        The first rank to ask gathers the batch (its leader): it waits until every rank at work
        has asked (or none did for a while, `_gather`), then sends all that wait, on a connection
        of its own while other batches are out. The others sleep on their own event until their
        batch is answered: a thousand ranks wake once each, not once per rank that asked before."""
        with self._lock:
            self._waiting.append(asked)
            self._last_asked = time.monotonic()
            lead = not self._gathering
            self._gathering = True
            self._check_full()
        if not lead:
            asked.answered.wait()
            return
        self._gather()
        with self._out:
            with self._lock:
                batch, self._waiting, self._gathering = self._waiting, [], False
                self._full.clear()
            try:
                self._send(batch)
            finally:
                for each in batch:
                    each.answered.set()

    def _gather(self) -> None:
        """Wait until every rank at work asked, or none did for BATCH_WINDOW_S, or MAX_GATHER_S."""
        end = time.monotonic() + MAX_GATHER_S
        while not self._full.wait(BATCH_WINDOW_S):
            now = time.monotonic()
            with self._lock:
                quiet = now - self._last_asked
            if quiet >= BATCH_WINDOW_S or now >= end:
                return

    def _checkout(self, timeout: float) -> Optional[Client]:
        """A connection to the relay no other batch is using; None when the relay is not used."""
        with self._lock:
            if self.unreachable is not None or self.silent is not None:
                return None
            if self._idle:
                return self._idle.pop()
            first, self._opened = self._opened == 0, self._opened + 1
        try:
            client = Client(self.url, timeout, self.log)
        except AgentTimeout as error:
            # Accepted, then nothing in time: a node that hangs (stopped, swapping), whose
            # ranks would each keep a connection of their own waiting as long again.
            self.silent = AgentTimeout(
                f"node {self.node}'s relay at {self.url} did not answer: {error.message}"
            )
            return None
        except ProbingError as error:
            self.log(f"node {self.node}: its relay at {self.url} cannot be reached ({error.message}); "
                     "asking its ranks one by one")  # fmt: skip
            self.unreachable = error
            return None
        if first:
            self.log(f"node {self.node}: its ranks are asked through its relay at {self.url}")
        return client

    def _send(self, batch: List[_Asked]) -> None:
        wait = max(each.timeout for each in batch)
        client = self._checkout(wait)
        if self.silent is not None:  # the node is not waited for again in this command
            for each in batch:
                each.error = self.silent
            return
        if client is None:
            for each in batch:
                each.direct = True
            return
        calls = [{"pid": each.pid, "method": each.method, "params": each.params} for each in batch]
        try:
            result, payload = client.call(
                "relay", {"calls": calls, "timeout": wait}, timeout=wait + RELAY_SLACK_S
            )
            replies = result.get("replies")
            if not isinstance(replies, list) or len(replies) != len(batch):
                raise BadReply(
                    f"the relay at {self.url} answered for {len(replies or [])} of {len(batch)} ranks"
                )
        except REFUSED as error:
            self.log(f"node {self.node}: its relay at {self.url} refused ({error.message}); "
                     "asking its ranks one by one")  # fmt: skip
            self._drop(client, error)
            for each in batch:
                each.direct = True
            return
        except ProbingError as error:
            self._drop(client, error)
            failed = AgentUnreachable(f"node {self.node}'s relay at {self.url} failed: {error.message}")
            if isinstance(error, AgentTimeout):
                self.silent = failed
            for each in batch:
                each.error = failed
            return
        with self._lock:
            self._idle.append(client)
        view = memoryview(payload)
        for each, entry in zip(batch, replies):
            each.entry = entry if isinstance(entry, dict) else {}
            offset, size = each.entry.get("offset"), each.entry.get("size")
            if (
                isinstance(offset, int)
                and isinstance(size, int)
                and 0 <= offset <= offset + size <= len(view)
            ):
                each.payload = bytearray(view[offset : offset + size])

    def _drop(self, client: Client, error: ProbingError) -> None:
        """The relay is not used again by this command: its node's ranks are asked directly."""
        self.unreachable = error
        client.close()


class RelayedClient(Client):
    """A Client of one rank of a relayed node: its requests go through the node's relay, or,
    when the relay could not be reached, to the rank itself over its own connection."""

    def __init__(self, relay: NodeRelay, rank: Rank, timeout: float, log: Log) -> None:
        # No socket of its own (Client.__init__ would open one): the relay holds the connection.
        self.relay = relay
        self.rank = rank
        self.path = f"tcp://{rank.endpoint}"
        self.timeout = timeout
        self.log = log
        self.info: Dict[str, Any] = {}
        self._direct: Optional[Client] = None
        self._sent: Optional[Tuple[str, Optional[Dict[str, Any]]]] = None
        self._closed = False
        self._identified = False

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        if not self._closed:
            self._closed = True
            self.relay.finished()

    def send(self, method: str, params: Optional[Dict[str, Any]] = None) -> None:
        if self._direct is not None:
            self._direct.send(method, params)
        else:
            self._sent = (method, params)

    def answered(self, timeout: float) -> bool:
        return True  # the relay answers for the rank within the request's own timeout

    def receive(self, method: str, timeout: Optional[float] = None) -> Tuple[Any, bytearray]:
        wait = self.timeout if timeout is None else timeout
        if self._direct is not None:
            return self._direct.receive(method, wait)
        sent_method, params = self._sent or (method, None)
        self._sent = None
        if not self._identified and sent_method not in LOOKS:
            self._relayed("ping", None, wait)  # who it is, before a request that acts
        return self._relayed(sent_method, params, wait)

    def _relayed(self, method: str, params: Optional[Dict[str, Any]], wait: float) -> Tuple[Any, bytearray]:
        if self._direct is not None:  # the relay could not reach it before (the ping): no more
            return self._direct.call(method, params, timeout=wait)
        asked = _Asked(self.rank.pid, method, params, wait)
        self.relay.ask(asked)
        if asked.entry.get("sent") is False:  # the relay could not reach it: nothing ran
            self.log(f"rank {self.rank.rank}: its node's relay could not reach it "
                     f"({str(asked.entry.get('error'))[:200]}); asking it directly")  # fmt: skip
            asked.direct = True
        if asked.direct:  # nothing went out: this rank is asked as it would be without relays
            self._direct = Client(self.path, wait, self.log)
            answer = self._direct.call(method, params, timeout=wait)  # a ping or a look
            self._identify(self._direct.info)  # its hello came with the answer
            return answer
        if asked.error is not None:
            raise asked.error
        return self._read(method, asked)

    def _identify(self, info: Dict[str, Any]) -> None:
        """The agent whose hello is `info` is this rank, or NotTheRank (a stale registry entry)."""
        mismatch = identity_mismatch(self.rank, self.path, info)
        if mismatch is not None:
            raise NotTheRank(mismatch, hint=STALE_ENDPOINT_HINT)
        self.info, self._identified = info, True

    def _read(self, method: str, asked: _Asked) -> Tuple[Any, bytearray]:
        """The rank's hello and reply as the relay passed them on, checked as a Client checks its own."""
        entry = asked.entry
        if "reply" not in entry:
            why = entry.get("error") if isinstance(entry.get("error"), str) else "no answer"
            where = f"rank {self.rank.rank} (PID {self.rank.pid} on node {self.relay.node})"
            message = f"{where}, asked through its node's relay: {str(why)[:300]}"
            if "no agent socket" in str(why):
                raise NoAgent(message)
            raise (AgentTimeout if "in time" in str(why) else AgentUnreachable)(message)
        try:
            # Every reply comes with the hello of the relay's own connection to the rank: each
            # is checked to be this rank's before its reply is read (the relay checked its PID).
            hello_id, hello_ok, hello = parse_reply(entry.get("hello") or {})
            if not hello_ok:
                raise error_from_reply(hello)
            self._identify(check_result("hello", hello))
            reply_id, ok, body = parse_reply(entry["reply"] if isinstance(entry["reply"], dict) else {})
        except FrameError as error:
            raise BadReply(f"unusable reply to {method!r} through the relay: {error}") from None
        if reply_id != 2 and (ok or reply_id is not None):
            raise BadReply(f"the reply to {method!r} through the relay answers another request")
        if not ok:
            raise error_from_reply(body, asked.payload)
        return check_result(method, body), asked.payload


def assign_relays(ranks: List[Rank], log: Log) -> None:
    """Ranks of other nodes, two or more on one node (torchrun's node rank and the address their
    agents listen on), are asked through that node's relay: the agent of its lowest rank.
    PROBING_RELAY=0 asks every rank directly."""
    import os

    if os.environ.get("PROBING_RELAY") == "0":
        return
    nodes: Dict[Tuple[int, str], List[Rank]] = {}
    for rank in ranks:
        if rank.remote and rank.endpoint and rank.unreachable is None and rank.pid:
            address = rank.endpoint.rsplit(":", 1)[0]
            nodes.setdefault((rank.node, address), []).append(rank)
    for (node, _), members in nodes.items():
        if len(members) < 2:
            continue
        relay = NodeRelay(str(min(members).endpoint), node, len(members), log)
        for rank in members:
            rank.relay = relay
