"""Reaching an agent over TCP (`tcp://HOST:PORT`): connect within the timeout, then prove the
shared token (protocol/auth.py) before a single frame is sent. After that the connection carries
the same frames as the Unix socket, read by the same checks: the peer is untrusted input.

An agent under a flood of connections that do not know the token (docs/decisions.md, issue 25)
may have no room for ours: while the agent's accept queue is full the kernel drops our SYN, or
the ACK that completes our connection (we then wait for a challenge that cannot come), and the
agent resets a connection it had to give up before its verdict. So a connection that brings no
challenge is started afresh after CONNECT_TRIES_S (the kernels would send the SYN or the SYN-ACK
again only after 1 s, then 2 or 3 s more), and a connection reset before the verdict (nothing was
asked yet) is tried again after DROPPED_RETRY_PAUSES_S; all within the command's timeout.
Anything else (a refusal, nothing listening, a peer that hangs up or speaks another protocol) is
the answer at once.

Imported only for a tcp:// target: the Unix-socket path of `probing PID backtrace` never pays
for the socket module.
"""

from __future__ import annotations

import _socket
import hashlib
import socket
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

from ..errors import AgentTimeout, AgentUnreachable, BadReply, PermissionDenied, UsageError
from ..protocol import auth, endpoints, sealed

SCHEME = "tcp://"
TOKEN_REFUSED_HINT = (
    "give the CLI the job's token: the same PROBING_TOKEN (or token file) as the job was started with"
)
NOT_AN_AGENT_HINT = "check HOST:PORT: `probing PID ranks` on the rank's node shows its endpoint"
TAMPERED_HINT = (
    "something between this node and the agent changed the traffic (a proxy, a NAT device, an "
    "attacker); nothing it sent was run. Reach the agent directly"
)
# How long each connection waits for the agent's challenge before a fresh one: growing, so that
# a slow link or a busy agent still fits; after the last, whatever the timeout leaves.
CONNECT_TRIES_S = (0.25, 0.5, 1.0, 2.0)
# The pauses before each new try when the agent reset the connection before its verdict: five
# tries at most, 1.5 s of pauses in all (a flood that outlasts them is the firewall's business).
DROPPED_RETRY_PAUSES_S = (0.05, 0.15, 0.3, 1.0)


class _DroppedBeforeVerdict(Exception):
    """The agent reset the connection before its verdict: `error` says so if no retry is left."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def split_endpoint(text: str) -> Tuple[str, int]:
    """(host, port) of `tcp://HOST:PORT` or `HOST:PORT` (`[v6]:PORT` too); UsageError if malformed."""
    address = text[len(SCHEME) :] if text.startswith(SCHEME) else text
    try:
        return endpoints.parse_endpoint(address)
    except endpoints.AddressError as error:
        raise UsageError(f"{error} (tcp://HOST:PORT as a target)") from None


def endpoint_url(host: str, port: int) -> str:
    return SCHEME + endpoints.format_endpoint(host, port)


def _resolve(host: str, port: int, url: str, deadline: float, timeout: float) -> List[Any]:
    """getaddrinfo's answers for (host, port) before `deadline`. An address is read as it is
    written; only a name is looked up, in a thread of its own: the resolver has no timeout of
    its own, and a dead DNS server must not hold the command past its time."""
    try:
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    except (OSError, UnicodeError):
        pass  # a name, not an address
    answer: List[Any] = []

    def look_up() -> None:
        try:
            answer.append(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except (OSError, UnicodeError) as error:
            answer.append(error)

    lookup = threading.Thread(target=look_up, name="probing-resolve", daemon=True)
    lookup.start()
    lookup.join(max(0.0, deadline - time.monotonic()))
    if not answer:
        raise AgentTimeout(f"cannot resolve the host of {url} within {timeout:g} s")
    if isinstance(answer[0], BaseException):
        error = answer[0]
        raise AgentUnreachable(
            f"cannot resolve the host of {url}: {getattr(error, 'strerror', None) or error}"
        )
    found: List[Any] = answer[0]
    return found


def _challenged(
    host: str, port: int, url: str, deadline: float, timeout: float, log: Callable[[str], None]
) -> Tuple[socket.socket, bytes]:
    """A connection to (host, port) and the CHALLENGE the agent sent on it, within `deadline`; a
    try that brings none is given up for a fresh one after each of CONNECT_TRIES_S."""
    waits = iter(CONNECT_TRIES_S)
    while True:
        wait = next(waits, None)
        try_deadline = deadline if wait is None else min(deadline, time.monotonic() + wait)
        try:
            sock = _connect(host, port, url, try_deadline, timeout)
        except AgentTimeout:
            if try_deadline >= deadline:
                raise
            log(f"{url}: no answer to connecting in {wait:g} s; connecting afresh")
            continue
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock, _receive_exactly(sock, auth.CHALLENGE_BYTES, try_deadline, url, "challenge")
        except AgentTimeout:
            sock.close()
            if try_deadline >= deadline:
                raise
            log(f"{url}: no challenge in {wait:g} s; connecting afresh")
        except BaseException:
            sock.close()
            raise


def _connect(host: str, port: int, url: str, deadline: float, timeout: float) -> socket.socket:
    """A connection to the first address of (host, port) that accepts one, all within `deadline`."""
    last: Optional[OSError] = None
    for family, kind, proto, _, address in _resolve(host, port, url, deadline, timeout):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = socket.socket(family, kind | socket.SOCK_CLOEXEC, proto)
        sock.settimeout(left)
        try:
            sock.connect(address)
            return sock
        except ConnectionResetError as error:
            sock.close()  # accepted and reset at once: a flooded agent had no room
            broken = AgentUnreachable(f"{url} broke the connection: {error.strerror or error}")
            raise _DroppedBeforeVerdict(broken) from None
        except OSError as error:
            sock.close()
            last = error
    if last is None or isinstance(last, socket.timeout):
        raise AgentTimeout(f"no connection to {url} within {timeout:g} s")
    if isinstance(last, ConnectionRefusedError):
        raise AgentUnreachable(
            f"nothing listens on {url}",
            hint="is the job's agent listening? (PROBING_LISTEN, or `probing PID listen` on its node)",
        )
    raise AgentUnreachable(f"cannot connect to {url}: {last.strerror or last}")


def _receive_exactly(sock: socket.socket, size: int, deadline: float, url: str, what: str) -> bytes:
    data = b""
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AgentTimeout(
                f"{url} sent no {what} in time: is it a probing agent?", hint=NOT_AN_AGENT_HINT
            )
        sock.settimeout(left)
        try:
            chunk = sock.recv(size - len(data))
        except socket.timeout:
            continue
        except OSError as error:
            broken = AgentUnreachable(f"{url} broke the connection: {error.strerror or error}")
            if isinstance(error, ConnectionResetError):
                raise _DroppedBeforeVerdict(broken) from None
            raise broken from None
        if not chunk:
            if what == "verdict":
                # An agent hangs up without a verdict only when it is no agent of ours, or full.
                raise BadReply(f"{url} hung up during the handshake", hint=NOT_AN_AGENT_HINT)
            raise BadReply(
                f"{url} hung up without a challenge: not a probing agent listening on TCP",
                hint=NOT_AN_AGENT_HINT,
            )
        data += chunk
    return data


def open_authenticated(url: str, timeout: float, log: Callable[[str], None]) -> _socket.socket:
    """A TCP connection to the agent at `url` that has passed the handshake with our token.

    No token here: UsageError with auth.TOKEN_HINT (exit 2). The agent refused it:
    PermissionDenied (exit 5). Nothing listens, or no answer in time: AgentUnreachable /
    AgentTimeout naming the endpoint. A peer that does not speak the handshake: BadReply. A
    connection the agent resets before its verdict is tried again (DROPPED_RETRY_PAUSES_S)."""
    host, port = split_endpoint(url)
    try:
        key = auth.key_of(auth.load_token())
    except auth.TokenError as error:
        raise UsageError(f"{url} needs the job's token: {error}", hint=auth.TOKEN_HINT) from None
    deadline = time.monotonic() + timeout
    pauses = iter(DROPPED_RETRY_PAUSES_S)
    while True:
        try:
            sock = _authenticate(host, port, url, key, deadline, timeout, log)
        except _DroppedBeforeVerdict as dropped:
            pause = next(pauses, None)
            if pause is None or time.monotonic() + pause >= deadline:
                raise dropped.error from None
            log(f"{url}: reset before the verdict (a busy agent); trying again in {pause:g} s")
            time.sleep(pause)
            continue
        log(f"{url}: authenticated")
        return sock


def _authenticate(
    host: str, port: int, url: str, key: bytes, deadline: float, timeout: float, log: Callable[[str], None]
) -> _socket.socket:
    """One try of open_authenticated: _DroppedBeforeVerdict if the agent reset it before its verdict."""
    sock, challenge = _challenged(host, port, url, deadline, timeout, log)
    try:
        try:
            agent_nonce, response = auth.respond(key, challenge)
        except auth.HandshakeError as error:
            raise BadReply(f"{url}: {error}", hint=NOT_AN_AGENT_HINT) from None
        try:
            sock.sendall(response)
        except OSError as error:
            broken = AgentUnreachable(f"{url} broke the connection: {error.strerror or error}")
            if isinstance(error, (ConnectionResetError, BrokenPipeError)):
                raise _DroppedBeforeVerdict(broken) from None
            raise broken from None
        verdict = _receive_exactly(sock, auth.VERDICT_BYTES, deadline, url, "verdict")
        try:
            auth.check_verdict(key, agent_nonce, response, verdict)
        except auth.HandshakeError as error:
            if error.refused:
                raise PermissionDenied(
                    f"the agent at {url} refused our token: PROBING_TOKEN differs from the job's",
                    hint=TOKEN_REFUSED_HINT,
                ) from None
            raise BadReply(f"{url}: {error}", hint=NOT_AN_AGENT_HINT) from None
        # From here on every byte travels in records sealed under this connection's own key:
        # a relay that passed the handshake along can neither read ours as its nor add its own.
        sealed_sock = sealed.SealedSocket(
            sock,
            auth.session_key(key, agent_nonce, response),
            sealed.CLIENT,
            _record_failure(url),
            sha256=hashlib.sha256,  # OpenSSL's: ~6x the built-in one; the CLI's memory is no job's
        )
    except BaseException:
        sock.close()
        raise
    sealed_sock.settimeout(max(0.001, deadline - time.monotonic()))
    return sealed_sock


def _record_failure(url: str) -> Callable[[sealed.RecordError], BaseException]:
    """What a record that fails its check becomes: a BadReply naming the endpoint. A stream that
    ends inside a record stays a broken connection (the agent's process may have died)."""

    def failure(error: sealed.RecordError) -> BaseException:
        if error.truncated:
            return error
        return BadReply(f"the connection to {url} was tampered with ({error})", hint=TAMPERED_HINT)

    return failure
