"""The handshakes a TCP listener has in progress, and who makes room for whom when a flood of
connections from peers that do not know the token fills them (acceptor.py holds the sockets).

Every connection costs the agent a descriptor until it proves the token, so the handshakes in
progress are capped; a flood fills the cap in milliseconds, and the question is which one goes
when a newcomer arrives. A peer is known only by its address until it proves the token, so:

- Fairness between sources: a source is an IPv4 address or an IPv6 /64 (one host's share of
  addresses). A newcomer from a source holding fewer handshakes than the heaviest source takes
  a slot of the heaviest one; a source at least as heavy as every other pays for its newcomers
  with its own oldest. A flood fills slots nobody else wants, never one another source needs.
- Progress is protected: a handshake that has sent part of its RESPONSE is never pushed out by
  a newcomer (a newcomer has sent nothing yet). A RESPONSE is 64 bytes in one write, so only a
  trickling peer stays half-way: each source may keep PROGRESSING_PER_SOURCE of those, all
  sources together a quarter of the slots; beyond that the trickler goes at once.
- A handshake already answered with a refusal (waiting a moment so that the peer can read it)
  is the first to go; a silent one goes oldest first within its source, so that every
  handshake gets the same time to answer and the legitimate one answers in a round trip.

When no handshake may go, the newcomer is turned away at once. Everything here is O(1) per
connection but finding the heaviest source, which is O(sources), and only when the table is
full. No socket objects here (the address functions only): the listener acts on what this
table decides.
"""

from __future__ import annotations

import collections
import socket
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

SILENT = "silent"  # the challenge went out, nothing came back yet
PROGRESSING = "progressing"  # part of the RESPONSE came
REFUSED = "refused"  # the verdict went out (a refusal); closed at its deadline

# Descriptors held for peers that have not proved the token: enough that a flood from one
# source leaves each handshake of that source (a client with the token too) ~25 ms to answer
# at 10 000 connects/s; never more than 1/16 of the job's descriptor limit, so that a flood
# cannot make the job's own open() fail.
MAX_HANDSHAKES = 256
MIN_HANDSHAKES = 16
PROGRESSING_PER_SOURCE = 4
_GONE = object()


class Handshake:
    """One connection between accept and its verdict; acceptor.py fills in the socket's side."""

    __slots__ = ("sock", "identity", "address", "source", "nonce", "received", "deadline", "state")

    def __init__(
        self,
        sock: Any,
        identity: Optional[Tuple[int, int]],
        address: Any,
        source: str,
        nonce: bytes,
        deadline: float,
    ) -> None:
        self.sock = sock
        self.identity = identity
        self.address = address  # the peer's, as accept() gave it
        self.source = source
        self.nonce = nonce
        self.received = b""
        self.deadline = deadline
        self.state = SILENT


def capacity() -> int:
    """MAX_HANDSHAKES, or 1/16 of the descriptors the job may open if that is fewer."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return MIN_HANDSHAKES
    if soft == resource.RLIM_INFINITY:
        return MAX_HANDSHAKES
    return max(MIN_HANDSHAKES, min(MAX_HANDSHAKES, soft // 16))


def source_of(address: Any) -> str:
    """The source a peer counts under: its IPv4 address (an IPv4-mapped IPv6 one too), the /64 of
    an IPv6 address (a host has a whole /64 to connect from), anything else as it reads."""
    host = address[0] if isinstance(address, tuple) and address else address
    if not isinstance(host, str) or ":" not in host:
        return str(host)
    bare = host.split("%", 1)[0]
    if bare.lower().startswith("::ffff:") and "." in bare:
        return bare[7:]
    try:
        packed = socket.inet_pton(socket.AF_INET6, bare)
    except (OSError, ValueError):
        return bare
    return socket.inet_ntop(socket.AF_INET6, packed[:8] + bytes(8)) + "/64"


class _Source:
    __slots__ = ("silent", "progressing", "count")

    def __init__(self) -> None:
        # Insertion-ordered dicts used as ordered sets: O(1) removal of any entry, oldest first.
        self.silent: Dict[Handshake, None] = {}
        self.progressing: Dict[Handshake, None] = {}
        self.count = 0  # its handshakes in every state, refused included


class PendingHandshakes:
    """The table: at most `capacity` handshakes, ordered by age within their source."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.progressing_cap = max(1, capacity // 4)
        self._sources: Dict[str, _Source] = {}
        # By deadline: every handshake gets the same time from accept (so arrival order is
        # deadline order), and every refusal the same linger from its verdict.
        self._waiting: Dict[Handshake, None] = {}
        self._refused: Deque[Handshake] = collections.deque()
        self._progressing = 0

    def __len__(self) -> int:
        return len(self._waiting) + len(self._refused)

    def __iter__(self) -> Iterator[Handshake]:
        yield from list(self._waiting)
        yield from list(self._refused)

    def full(self) -> bool:
        return len(self) >= self.capacity

    def add(self, entry: Handshake) -> None:
        source = self._sources.get(entry.source)
        if source is None:
            source = self._sources[entry.source] = _Source()
        source.silent[entry] = None
        source.count += 1
        self._waiting[entry] = None

    def remove(self, entry: Handshake) -> None:
        """Forget `entry`, whatever its state (done, dropped or closed); twice is harmless."""
        if entry.state == REFUSED:
            try:
                self._refused.remove(entry)  # O(1) at the front, where refusals mostly leave
            except ValueError:
                return
        else:
            if self._waiting.pop(entry, _GONE) is _GONE:
                return
            if entry.state == PROGRESSING:
                del self._sources[entry.source].progressing[entry]
                self._progressing -= 1
            else:
                del self._sources[entry.source].silent[entry]
        source = self._sources[entry.source]
        source.count -= 1
        if source.count == 0:
            del self._sources[entry.source]

    def progressing(self, entry: Handshake) -> bool:
        """`entry` has sent part of its RESPONSE: protected from now on. False when its source
        (or every source together) already holds its share of half-way handshakes: drop it."""
        if entry.state != SILENT:
            return True
        source = self._sources[entry.source]
        if len(source.progressing) >= PROGRESSING_PER_SOURCE or self._progressing >= self.progressing_cap:
            return False
        del source.silent[entry]
        source.progressing[entry] = None
        self._progressing += 1
        entry.state = PROGRESSING
        return True

    def refused(self, entry: Handshake, deadline: float) -> None:
        """`entry` got its refusal; it stays until `deadline` unless room is needed first."""
        source = self._sources[entry.source]
        if entry.state == PROGRESSING:
            del source.progressing[entry]
            self._progressing -= 1
        else:
            del source.silent[entry]
        del self._waiting[entry]
        entry.state = REFUSED
        entry.deadline = deadline
        self._refused.append(entry)

    def victim_for(self, newcomer: str) -> Optional[Handshake]:
        """Which handshake goes to make room for a newcomer from source `newcomer` (call when
        full()); None: none may, the newcomer is turned away."""
        if self._refused:
            return self._refused[0]
        own = self._sources.get(newcomer)
        own_count = own.count if own is not None else 0
        heaviest: Optional[_Source] = None
        most = own_count  # only a source heavier than the newcomer's gives up a slot to it
        for source in self._sources.values():
            if source.count > most and source.silent:
                heaviest, most = source, source.count
        if heaviest is not None:
            return next(iter(heaviest.silent))
        if own is not None and own.silent:
            return next(iter(own.silent))
        return None

    def next_deadline(self) -> Optional[float]:
        deadlines = []
        if self._waiting:
            deadlines.append(next(iter(self._waiting)).deadline)
        if self._refused:
            deadlines.append(self._refused[0].deadline)
        return min(deadlines) if deadlines else None

    def expired(self, now: float) -> List[Handshake]:
        """The handshakes whose deadline has passed, oldest first (still in the table)."""
        found: List[Handshake] = []
        for entry in self._waiting:
            if entry.deadline > now:
                break
            found.append(entry)
        for entry in self._refused:
            if entry.deadline > now:
                break
            found.append(entry)
        return found

    def counts(self) -> Dict[str, int]:
        """How many handshakes are in progress, how many of them half-way, from how many
        sources (for `hello`)."""
        return {"in_progress": len(self), "half_way": self._progressing, "sources": len(self._sources)}
