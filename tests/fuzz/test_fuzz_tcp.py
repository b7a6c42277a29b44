"""TCP: the handshake (protocol/auth.py) read by each side, and the sealed records (protocol/
sealed.py) that carry the frames after it.

- A client (`probing tcp://HOST:PORT ...`, client/tcp.py) reads a peer's CHALLENGE and VERDICT:
  a fake agent on loopback sends it the input instead.
- An agent's listener judges a RESPONSE (auth.verdict): it must accept exactly the responses
  that prove the token, as an independent HMAC computes it.
- A client reads an agent's replies in sealed records: a fake agent that knows the token (a
  hostile job does) passes the handshake, then sends the input's records, each sealed again
  under this connection's key (a record whose check failed under the input's key fails it here).
- An agent reads a client's requests in sealed records (SealedSocket, then the frame reader and
  the request's schema as the agent's server reads them).
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import threading
from time import monotonic
from typing import Any, Callable, List, Optional, Tuple

from agents import TOKEN, FakeTcpAgent
from harness import (
    BYTES,
    KEY_BYTES,
    MAC_BYTES,
    Broken,
    frames,
    fuzzes,
    refusal_problem,
    sealed,
    sealed_streams,
    text_values,
)

from probing.client.connection import Client
from probing.client.tcp import split_endpoint
from probing.errors import UsageError
from probing.protocol import auth, endpoints
from probing.protocol import sealed as sealed_records
from probing.protocol.frames import MAX_REQUEST_BYTES, ConnectionClosed, FrameError, FrameReader
from probing.protocol.messages import parse_request

KEY = auth.key_of(TOKEN)
_LENGTH = struct.Struct(">I")


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


# --- the handshake, as a client reads it -------------------------------------------------------


@fuzzes("handshake-client", examples=60)
def test_a_handshake_as_the_client_reads_it(tcp_agent: FakeTcpAgent, data: bytes) -> Any:
    """Whatever a peer without the token sends, the client refuses it with an error that says so."""
    tcp_agent.serve = lambda connection: connection.sendall(data)
    with Client(tcp_agent.url, 5.0) as client:
        return client.call("backtrace", {"locals": False, "thread": None})


# --- the handshake, as an agent judges a response ---------------------------------------------


def proves_the_token(nonce: bytes, response: bytes) -> bool:
    """RESPONSE = client nonce + HMAC-SHA256(key, "client\\0" + agent nonce + client nonce)."""
    if len(nonce) != auth.NONCE_BYTES or len(response) != auth.RESPONSE_BYTES:
        return False
    client_nonce = response[: auth.NONCE_BYTES]
    proof = hmac.new(KEY, b"client\x00" + nonce + client_nonce, hashlib.sha256).digest()
    return hmac.compare_digest(proof, response[auth.NONCE_BYTES :])


def judged_as_it_should(answer: Tuple[bytes, bytes, bool, bytes]) -> Optional[str]:
    nonce, response, accepted, verdict = answer
    if len(verdict) != auth.VERDICT_BYTES:
        return f"a verdict of {len(verdict)} bytes"
    proves = proves_the_token(nonce, response)
    if accepted != proves or verdict[:1] != (auth.ACCEPTED if accepted else auth.REFUSED):
        said = "proves" if proves else "does not prove"
        return f"accepted={accepted} ({verdict[:1]!r}) for a response that {said} the token"
    return None


@fuzzes("handshake-agent", examples=150, allowed=(), answer=judged_as_it_should)
def test_a_response_as_the_agent_judges_it(data: bytes) -> Tuple[bytes, bytes, bool, bytes]:
    """An input is the agent's nonce (32 bytes) and what a peer sent as its RESPONSE."""
    nonce, response = data[: auth.NONCE_BYTES], data[auth.NONCE_BYTES :]
    accepted, verdict = auth.verdict(KEY, nonce, response)
    if accepted:
        auth.session_key(KEY, nonce, response)
    return nonce, response, accepted, verdict


# --- sealed records, as a client reads an agent's ----------------------------------------------


def resealed(data: bytes, session_key: bytes) -> bytes:
    """The records of `data` (its own key first) sealed under `session_key` in the same order:
    a record that passed its check under the input's key passes it here, one that failed fails.
    What follows the last whole record goes as it is."""
    old, records = auth.HmacSha256(data[:KEY_BYTES]), data[KEY_BYTES:]
    new = auth.HmacSha256(session_key)
    label = sealed_records._TO_CLIENT
    out, at, sequence = bytearray(), 0, 0
    while len(records) - at >= _LENGTH.size:
        (length,) = _LENGTH.unpack_from(records, at)
        end = at + _LENGTH.size + length + MAC_BYTES
        if length > sealed_records.MAX_RECORD_BYTES or end > len(records):
            break
        body, mac = records[at : end - MAC_BYTES], records[end - MAC_BYTES : end]
        number = struct.pack(">Q", sequence)
        passes = hmac.compare_digest(old.digest((label, number, body)), mac)
        out += body + (new.digest((label, number, body)) if passes else bytes(MAC_BYTES))
        at, sequence = end, sequence + 1
    return bytes(out + records[at:])


def serve_sealed(data: bytes) -> Callable[[socket.socket], None]:
    def serve(connection: socket.socket) -> None:
        nonce, challenge = auth.challenge()
        connection.sendall(challenge)
        response = recv_exactly(connection, auth.RESPONSE_BYTES)
        accepted, verdict = auth.verdict(KEY, nonce, response)
        connection.sendall(verdict)
        if accepted:
            connection.sendall(resealed(data, auth.session_key(KEY, nonce, response)))

    return serve


def tcp_ask(agent: FakeTcpAgent, data: bytes, method: str) -> Any:
    agent.serve = serve_sealed(data)
    with Client(agent.url, 5.0) as client:
        if method == "backtrace":
            from probing.client.replies import decode_reply_table

            result, payload = client.call("backtrace", {"locals": False, "thread": None})
            return decode_reply_table(result, payload).to_rows()
        if method == "table":
            return client.fetch_table("python.threads").to_rows()
        return client.describe_tables()


@fuzzes(
    "sealed",
    examples=150,
    mutations=(sealed(sealed_records.AGENT, BYTES + (frames(),) * 4),),
    scratch=sealed_streams(sealed_records.AGENT),
)
def test_sealed_replies_as_the_client_reads_them(tcp_agent: FakeTcpAgent, data: bytes) -> List[Any]:
    """An input is a session key (32 bytes) and the records an agent sealed under it."""
    return [tcp_ask(tcp_agent, data, method) for method in ("backtrace", "table", "tables")]


# --- sealed records, as an agent reads a client's ----------------------------------------------


def requests_read(data: bytes) -> List[Tuple[Any, str, Any]]:
    """The requests an agent reads from `data` (a session key, then records a client sealed)."""
    theirs, ours = socket.socketpair()

    def send() -> None:
        theirs.sendall(data[KEY_BYTES:])
        theirs.shutdown(socket.SHUT_WR)

    writer = threading.Thread(target=send)
    key = data[:KEY_BYTES].ljust(KEY_BYTES, b"\0")
    agent_side = sealed_records.SealedSocket(ours, key, sealed_records.AGENT)
    read: List[Tuple[Any, str, Any]] = []
    try:
        writer.start()
        reader = FrameReader(agent_side, MAX_REQUEST_BYTES)
        while True:
            frame = reader.read(deadline=monotonic() + 5, frame_time=5)
            if frame is None:
                return read
            try:
                read.append(parse_request(frame.header))
            except FrameError as error:
                if error.fatal:
                    raise
    finally:
        agent_side.close()
        writer.join(10)
        theirs.close()


@fuzzes(
    "sealed-requests",
    examples=150,
    mutations=(sealed(sealed_records.CLIENT, BYTES + (frames(),) * 4),),
    scratch=sealed_streams(sealed_records.CLIENT),
    allowed=(FrameError, ConnectionClosed, sealed_records.RecordError),
)
def test_sealed_requests_as_the_agent_reads_them(data: bytes) -> List[Tuple[Any, str, Any]]:
    """The agent's refusals are FrameError (it replies with an error), ConnectionClosed and
    RecordError (it hangs up); anything else would end in its handler's catch-all."""
    return requests_read(data)


# --- endpoints a job publishes, and listen addresses it sets ------------------------------------


def endpoints_problem(answer: List[Optional[Tuple[str, int]]]) -> Optional[str]:
    """An endpoint to dial (the first and last answers) has a host without spaces or slashes and
    a port from 1 to 65535; a listen address (the second) a port from 0."""
    for index, parsed in enumerate(answer):
        if parsed is None:
            continue
        host, port = parsed
        dialed = index != 1
        if not isinstance(port, int) or not (1 if dialed else 0) <= port <= 65535:
            return f"port {port!r} out of range"
        if dialed and any(char.isspace() or char == "/" for char in host):
            return f"host {host!r} holds a space or a slash"
    return None


ENDPOINT_MUTATIONS = BYTES + (text_values(),) * 3


@fuzzes("endpoints", examples=150, mutations=ENDPOINT_MUTATIONS, allowed=(), answer=endpoints_problem)
def test_endpoints_and_listen_addresses(data: bytes) -> List[Optional[Tuple[str, int]]]:
    """An endpoint in the registry (HOST:PORT, which the CLI dials) and PROBING_LISTEN are the
    job's text: each parser returns an address, or refuses with AddressError (the CLI's
    UsageError, exit 2, for a target typed as tcp://...)."""
    text = data.decode("utf-8", "surrogateescape")
    parsed: List[Optional[Tuple[str, int]]] = []
    parsers = (endpoints.parse_endpoint, lambda each: endpoints.parse_listen_address(each, 3), split_endpoint)
    for parse in parsers:
        try:
            parsed.append(parse(text))
        except (endpoints.AddressError, UsageError) as refused:
            problem = refusal_problem(refused)
            if problem is not None:
                raise Broken(problem) from None
            parsed.append(None)
    return parsed
