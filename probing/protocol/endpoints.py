"""HOST:PORT as both sides write and read it: the address an agent listens on (`[HOST:]PORT |
auto`: PROBING_LISTEN, `probing run --listen`, a `listen` request), and the endpoint a CLI dials
(`tcp://HOST:PORT`, `--endpoints`, the registry). An IPv6 host is written in brackets,
`[::1]:PORT`: without them its last colon could be the port's.

A leaf (standard library only, Python 3.8): the agent parses its listen address with the same
function that lets `probing run --listen` refuse a bad one before the job starts.
"""

from __future__ import annotations

from typing import Optional, Tuple

AUTO = "auto"
EVERY_INTERFACE = "0.0.0.0"  # noqa: S104 - listening on every interface is what `auto` asks
LISTEN_FORMS = "PORT, HOST:PORT ([v6]:PORT for IPv6) or auto (every address, a free port)"
MAX_HOST_CHARS = 255


class AddressError(ValueError):
    """A listen address or an endpoint that is malformed; the message says what form it takes."""


def _split(text: str) -> Tuple[Optional[str], str]:
    """(host, port text) of `[HOST:]PORT`; host None when the text has no colon at all, and
    the brackets of `[v6]` taken off. An IPv6 host without brackets is refused."""
    host, separator, port_text = text.rpartition(":")
    if not separator:
        return None, text
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1], port_text
    if ":" in host:
        raise AddressError("write an IPv6 host in brackets, [::1]:PORT")
    return host, port_text


def _port(text: str) -> Optional[int]:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 8 else None


def parse_listen_address(text: str, port_offset: int = 0) -> Tuple[str, int]:
    """(host, port) to bind for `[HOST:]PORT | auto`. HOST defaults to every interface; port 0
    is any free port. A fixed port is moved by `port_offset` (the agent's LOCAL_RANK: every rank
    of a node reads the same PROBING_LISTEN, and each needs a port of its own)."""
    spec = text.strip()
    if spec.lower() == AUTO:
        return EVERY_INTERFACE, 0
    try:
        host, port_text = _split(spec)
    except AddressError as error:
        raise AddressError(f"listen address {text!r:.80}: {error}") from None
    port = _port(port_text)
    if port is None:
        raise AddressError(f"listen address {text!r:.80} is not [HOST:]PORT or auto")
    if port:
        port += port_offset
    if not 0 <= port <= 65535:
        raise AddressError(f"listen address {text!r:.80}: port {port} is out of range (0 to 65535)")
    return host or EVERY_INTERFACE, port


def parse_endpoint(text: str) -> Tuple[str, int]:
    """(host, port) of an endpoint to dial, `HOST:PORT` or `[v6]:PORT`: a host is needed, and a
    port from 1 to 65535. The host is an address or a name, never a path or spaces."""
    try:
        host, port_text = _split(text)
    except AddressError as error:
        raise AddressError(f"an endpoint is HOST:PORT, not {text!r:.80}: {error}") from None
    port = _port(port_text)
    if (
        not host
        or len(host) > MAX_HOST_CHARS
        or any(char.isspace() or char in "/[]" for char in host)
        or port is None
        or not 0 < port < 65536
    ):
        raise AddressError(f"an endpoint is HOST:PORT, not {text!r:.80}")
    return host, port


def format_endpoint(host: str, port: int) -> str:
    """ "HOST:PORT", with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
