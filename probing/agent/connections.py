"""One client connection as the agent tracks it (who, since when, doing what), and which
connection the current thread serves.
"""

from __future__ import annotations

import socket
from typing import Any, Dict, List, Optional, Tuple

from ..originals import POLLIN, Socket, local, monotonic, poll
from .sockets import descriptor_identity

# The connection a connection thread serves, for handlers that wait long (memory --growth).
_serving = local()


def client_gone() -> bool:
    """Whether the client of the connection this thread serves has closed its end."""
    conn = getattr(_serving, "connection", None)
    if conn is None:
        return False
    try:
        poller = poll()  # not select(): a training job may have more than 1024 descriptors
        poller.register(conn.fileno(), POLLIN)
        if not poller.poll(0):
            return False
        return bool(conn.recv(1, socket.MSG_PEEK) == b"")
    except BlockingIOError:  # over TCP: part of a sealed record has arrived, the rest is coming
        return False
    except OSError:
        return True


def serve_on_this_thread(conn: Optional[Socket]) -> None:
    _serving.connection = conn


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
        "peer",
        "connected_at",
        "requests",
        "last_request_at",
        "method",
        "busy_since",
        "evicted",
    )

    def __init__(self, sock: Socket, pid: Optional[int], peer: Optional[str] = None) -> None:
        self.sock = sock
        self.identity = descriptor_identity(sock)
        self.pid = pid  # None over TCP: the peer is on another node, its address is what we know
        self.peer = peer
        self.connected_at = monotonic()
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
        who: Dict[str, Any] = {"pid": self.pid} if self.peer is None else {"pid": None, "peer": self.peer}
        return {
            **who,
            "state": "busy" if busy else "idle",
            "method": self.method if busy else None,
            "age_s": round(now - self.connected_at, 3),
            "busy_s": round(now - self.busy_since, 3) if self.busy_since is not None else None,
            "requests": self.requests,
        }


def _who(entry: Dict[str, Any]) -> str:
    return f"PID {entry['pid']}" if entry.get("peer") is None else f"from {entry['peer']}"


def busy_message(described: List[Dict[str, Any]]) -> str:
    running = ", ".join(
        f"{entry['method']} for {entry['busy_s']:.1f} s ({_who(entry)})" for entry in described[:8]
    )
    more = f" and {len(described) - 8} more" if len(described) > 8 else ""
    return (
        f"the agent serves {len(described)} connections, all running a request: {running}{more}; "
        "try again when one of them ends"
    )
