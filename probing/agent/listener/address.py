"""Where the agent listens on TCP (PROBING_LISTEN, or a `listen` request) and the endpoint it
publishes for other nodes to reach it."""

from __future__ import annotations

import os
import socket
from typing import Any, Mapping, Optional, Tuple

from ...originals import Socket, getaddrinfo
from ...protocol import endpoints
from ...protocol.endpoints import AddressError as AddressError
from ..sockets import lifted

WILDCARD_HOSTS = ("", endpoints.EVERY_INTERFACE, "::")
LISTEN_ENV = "PROBING_LISTEN"
_OFF = ("", "0", "off", "false", "no")


def listen_setting() -> Optional[str]:
    """PROBING_LISTEN when it asks for a listener, else None."""
    value = os.environ.get(LISTEN_ENV, "").strip()
    return None if value.lower() in _OFF else value


def parse_listen_address(text: str, environ: Optional[Mapping[str, str]] = None) -> Tuple[str, int]:
    """(host, port) of `[HOST:]PORT | auto`.

    A fixed port P becomes P + LOCAL_RANK: every rank on a node reads the same PROBING_LISTEN,
    and each needs a port of its own. Port 0 (any free port) stays 0.
    """
    env = os.environ if environ is None else environ
    local_rank = env.get("LOCAL_RANK", "0")
    return endpoints.parse_listen_address(text, int(local_rank) if local_rank.isdecimal() else 0)


def bind_tcp(host: str, port: int, backlog: int) -> Socket:
    """A listening, non-blocking TCP socket; OSError (address in use, no such host) as it comes."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    infos = getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    listener = lifted(Socket(family, kind | socket.SOCK_CLOEXEC, proto))
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(backlog)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener


def published_endpoint(listener: Socket, environ: Optional[Mapping[str, str]] = None) -> str:
    """ "HOST:PORT" as another node should dial it.

    A socket bound to every interface has no address of its own to give: the one on the route
    towards the job's rendezvous host is the one the other nodes can reach (a UDP connect()
    sends nothing, it only picks the route), else the host name.
    """
    env = os.environ if environ is None else environ
    bound = listener.getsockname()
    host, port = str(bound[0]), int(bound[1])
    if host in WILDCARD_HOSTS:
        host = _route_address(env.get("MASTER_ADDR"), env.get("MASTER_PORT")) or socket.gethostname()
    return endpoints.format_endpoint(host, port)


def _route_address(master_host: Optional[str], master_port: Optional[str]) -> Optional[str]:
    if not master_host:
        return None
    port = int(master_port) if master_port and master_port.isdecimal() else 29500
    try:
        infos = getaddrinfo(master_host, port, 0, socket.SOCK_DGRAM)
        family, kind, proto, _, address = infos[0]
        probe = Socket(family, kind, proto)
        try:
            probe.connect(address)
            local = str(probe.getsockname()[0])
        finally:
            probe.close()
    except (OSError, UnicodeError):
        return None
    return None if local in WILDCARD_HOSTS else local


def peer_text(address: Any) -> str:
    """A peer's address as the agent says it (`hello`, a Busy reply)."""
    if isinstance(address, tuple) and len(address) >= 2:
        return endpoints.format_endpoint(str(address[0]), address[1])
    return str(address)
