"""Sealed records (protocol/sealed.py) over socketpairs: frames of every size pass through them
unchanged, and every way a relay could touch the stream (a changed byte, a replayed, reordered,
reflected, truncated or oversize record) ends the connection with RecordError."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading
from typing import Iterator, List, Tuple

import pytest

from probing.agent import connections
from probing.protocol import auth, sealed
from probing.protocol.frames import MAX_REPLY_BYTES, MAX_REQUEST_BYTES, FrameReader, send_frame
from probing.protocol.messages import request

SESSION_KEY = os.urandom(32)


@pytest.fixture
def pair() -> Iterator[Tuple[sealed.SealedSocket, sealed.SealedSocket]]:
    """(agent end, client end), both sealed."""
    a, b = socket.socketpair()
    agent = sealed.SealedSocket(a, SESSION_KEY, sealed.AGENT)
    client = sealed.SealedSocket(b, SESSION_KEY, sealed.CLIENT)
    yield agent, client
    agent.close()
    client.close()


@pytest.fixture
def wire() -> Iterator[Tuple[sealed.SealedSocket, socket.socket]]:
    """(agent end sealed, the raw other end): the test plays the relay on the raw end."""
    a, b = socket.socketpair()
    agent = sealed.SealedSocket(a, SESSION_KEY, sealed.AGENT)
    yield agent, b
    agent.close()
    b.close()


def records_from(sender: socket.socket, receiver: socket.socket, *messages: bytes) -> List[bytes]:
    """The raw records `sender` puts on the wire for each message, read off `receiver`."""
    records = []
    for message in messages:
        sender.sendall(message)
        header = receiver.recv(4, socket.MSG_WAITALL)
        (length,) = struct.unpack(">I", header)
        records.append(header + receiver.recv(length + auth.MAC_BYTES, socket.MSG_WAITALL))
    return records


def client_records(*messages: bytes) -> List[bytes]:
    """Records as the client of this session would send them (a relay records them)."""
    a, b = socket.socketpair()
    client = sealed.SealedSocket(a, SESSION_KEY, sealed.CLIENT)
    try:
        return records_from(client, b, *messages)
    finally:
        client.close()
        b.close()


def test_the_session_key_is_the_same_on_both_ends_and_new_for_each_connection() -> None:
    key = auth.key_of("a token of twenty characters")
    agent_nonce, challenge = auth.challenge()
    _, response = auth.respond(key, challenge)
    accepted, _ = auth.verdict(key, agent_nonce, response)
    assert accepted
    session = auth.session_key(key, agent_nonce, response)
    expected = hmac.new(key, b"session\x00" + agent_nonce + response[:32], hashlib.sha256).digest()
    assert session == expected
    other_nonce, other_challenge = auth.challenge()
    assert auth.session_key(key, other_nonce, auth.respond(key, other_challenge)[1]) != session


def test_frames_small_and_large_pass_through_unchanged(
    pair: Tuple[sealed.SealedSocket, sealed.SealedSocket],
) -> None:
    agent, client = pair
    client.settimeout(10)
    agent.settimeout(10)
    send_frame(client, request(1, "hello", {}))
    send_frame(client, request(2, "eval", {"code": "1 + 1"}))
    reader = FrameReader(agent, MAX_REQUEST_BYTES)
    first, second = reader.read(), reader.read()
    assert first is not None and first.header["method"] == "hello"
    assert second is not None and second.header["params"] == {"code": "1 + 1"}

    # A 5 MiB payload in many small chunks and one large one: sendmsg, several records each way.
    payload = [os.urandom(1000) for _ in range(300)] + [os.urandom(5 << 20)]
    sender = threading.Thread(target=send_frame, args=(agent, {"id": 3, "ok": True}, payload))
    sender.start()
    frame = FrameReader(client, MAX_REPLY_BYTES).read()
    sender.join(10)
    assert frame is not None and frame.header == {"id": 3, "ok": True}
    assert bytes(frame.payload) == b"".join(payload)
    assert agent.pending() == 0 and client.pending() == 0


def test_a_changed_byte_ends_the_connection_and_nothing_of_it_is_read(
    wire: Tuple[sealed.SealedSocket, socket.socket],
) -> None:
    agent, relay = wire
    good, bad = client_records(b"first request", b"second request")
    tampered = bytearray(bad)
    tampered[6] ^= 0x01
    relay.sendall(good + bytes(tampered))
    assert agent.recv(100) == b"first request"
    with pytest.raises(sealed.RecordError, match="failed its check"):
        agent.recv(100)
    with pytest.raises(sealed.RecordError):  # and for good: nothing after it is ever read
        agent.recv(100)


def test_a_forged_record_without_the_key_fails() -> None:
    a, b = socket.socketpair()
    agent = sealed.SealedSocket(a, SESSION_KEY, sealed.AGENT)
    forger = sealed.SealedSocket(b, os.urandom(32), sealed.CLIENT)
    with agent, forger:
        forger.sendall(b'{"method": "eval"}')
        with pytest.raises(sealed.RecordError, match="failed its check"):
            agent.recv(100)


def test_a_replayed_record_fails(wire: Tuple[sealed.SealedSocket, socket.socket]) -> None:
    agent, relay = wire
    (record,) = client_records(b"eval: open('x', 'w')")
    relay.sendall(record + record)
    assert agent.recv(100) == b"eval: open('x', 'w')"
    with pytest.raises(sealed.RecordError):
        agent.recv(100)


def test_reordered_records_fail(wire: Tuple[sealed.SealedSocket, socket.socket]) -> None:
    agent, relay = wire
    first, second = client_records(b"one", b"two")
    relay.sendall(second + first)
    with pytest.raises(sealed.RecordError):
        agent.recv(100)


def test_a_dropped_record_makes_the_next_fail(wire: Tuple[sealed.SealedSocket, socket.socket]) -> None:
    agent, relay = wire
    _, second = client_records(b"one", b"two")
    relay.sendall(second)
    with pytest.raises(sealed.RecordError):
        agent.recv(100)


def test_a_record_reflected_to_its_sender_fails() -> None:
    a, b = socket.socketpair()
    agent = sealed.SealedSocket(a, SESSION_KEY, sealed.AGENT)
    with agent, b:
        # What the agent sent comes back to it, as if from the client: same key, same sequence.
        (record,) = records_from(agent, b, b"a reply")
        b.sendall(record)
        with pytest.raises(sealed.RecordError, match="failed its check"):
            agent.recv(100)


def test_a_stream_ending_inside_a_record_fails(wire: Tuple[sealed.SealedSocket, socket.socket]) -> None:
    agent, relay = wire
    (record,) = client_records(b"a whole request, cut short")
    relay.sendall(record[:-5])
    relay.shutdown(socket.SHUT_WR)
    with pytest.raises(sealed.RecordError) as raised:
        agent.recv(100)
    assert raised.value.truncated


def test_an_end_of_stream_between_records_is_a_clean_close(
    wire: Tuple[sealed.SealedSocket, socket.socket],
) -> None:
    agent, relay = wire
    (record,) = client_records(b"last words")
    relay.sendall(record)
    relay.shutdown(socket.SHUT_WR)
    assert agent.recv(100) == b"last words"
    assert agent.recv(100) == b""


def test_an_oversize_length_fails_before_anything_is_buffered(
    wire: Tuple[sealed.SealedSocket, socket.socket],
) -> None:
    agent, relay = wire
    relay.sendall(struct.pack(">I", sealed.MAX_RECORD_BYTES + 1) + b"x" * 100)
    with pytest.raises(sealed.RecordError, match="announced"):
        agent.recv(100)


def test_the_client_gets_its_own_error_for_a_tampered_record() -> None:
    a, b = socket.socketpair()

    def failure(error: sealed.RecordError) -> BaseException:
        return RuntimeError(f"the connection to tcp://h:p was tampered with ({error})")

    client = sealed.SealedSocket(a, SESSION_KEY, sealed.CLIENT, failure)
    with client, b:
        b.sendall(struct.pack(">I", 3) + b"abc" + bytes(32))
        with pytest.raises(RuntimeError, match=r"tampered with \(a record failed its check\)"):
            client.recv(10)


def test_a_timeout_in_the_middle_of_a_record_keeps_the_stream_whole(
    wire: Tuple[sealed.SealedSocket, socket.socket],
) -> None:
    agent, relay = wire
    first, second = client_records(b"x" * 1000, b"the next one")
    agent.settimeout(0.05)
    relay.sendall(first[:500])
    with pytest.raises(socket.timeout):
        agent.recv(2000)
    assert agent.pending() == 500
    relay.sendall(first[500:700])
    with pytest.raises(socket.timeout):
        agent.recv(2000)
    assert agent.gettimeout() == 0.05  # the deadline inside recv put the caller's timeout back
    relay.sendall(first[700:] + second)
    assert agent.recv(2000) == b"x" * 1000
    assert agent.recv(2000) == b"the next one"


def test_a_dripping_peer_is_bounded_by_one_timeout_not_one_per_recv(
    wire: Tuple[sealed.SealedSocket, socket.socket],
) -> None:
    agent, relay = wire
    (record,) = client_records(b"y" * 100)
    agent.settimeout(0.3)
    stop = threading.Event()

    def drip() -> None:
        for byte in record[:-1]:
            if stop.wait(0.02):
                return
            relay.send(bytes([byte]))

    dripper = threading.Thread(target=drip)
    dripper.start()
    try:
        with pytest.raises(socket.timeout):
            agent.recv(200)
    finally:
        stop.set()
        dripper.join()


def test_client_gone_reads_checked_bytes_and_a_close(
    wire: Tuple[sealed.SealedSocket, socket.socket],
) -> None:
    agent, relay = wire
    connections.serve_on_this_thread(agent)
    try:
        assert not connections.client_gone()  # nothing at all: still there
        first, second = client_records(b"0123456789", b"more")
        relay.sendall(first[:5])
        assert not connections.client_gone()  # part of a record: on its way
        relay.sendall(first[5:])
        assert not connections.client_gone()
        assert agent.recv(5) == b"01234"
        # Plaintext buffered, nothing new on the socket: not gone, and the peek consumed nothing.
        assert not connections.client_gone()
        assert agent.recv(100) == b"56789"
        relay.sendall(second)
        relay.shutdown(socket.SHUT_WR)
        assert not connections.client_gone()  # a record is there to read before the end
        assert agent.recv(100) == b"more"
        assert connections.client_gone()
    finally:
        connections.serve_on_this_thread(None)


def test_client_gone_after_a_close_inside_a_record(wire: Tuple[sealed.SealedSocket, socket.socket]) -> None:
    agent, relay = wire
    connections.serve_on_this_thread(agent)
    try:
        (record,) = client_records(b"cut")
        relay.sendall(record[:6])
        relay.shutdown(socket.SHUT_WR)
        assert connections.client_gone()
    finally:
        connections.serve_on_this_thread(None)


def test_recv_into_and_send_are_sealed_too(pair: Tuple[sealed.SealedSocket, sealed.SealedSocket]) -> None:
    agent, client = pair
    assert client.send(b"hello there") == 11
    buffer = bytearray(32)
    assert agent.recv_into(buffer) == 11 and bytes(buffer[:11]) == b"hello there"
    with pytest.raises(ValueError):
        agent.recv(10, socket.MSG_WAITALL)
    with pytest.raises(ValueError):
        agent.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"")])


def test_the_handshake_socket_is_taken_over_with_its_timeout_and_descriptor() -> None:
    a, b = socket.socketpair()
    a.settimeout(2.5)
    number = a.fileno()
    agent = sealed.SealedSocket(a, SESSION_KEY, sealed.AGENT)
    with agent, b:
        assert agent.fileno() == number and a.fileno() == -1
        assert agent.gettimeout() == 2.5


def test_openssls_sha256_on_one_end_and_the_built_in_one_on_the_other_agree() -> None:
    """The CLI seals with OpenSSL's SHA-256, an agent in a job without torch with the built-in."""
    a, b = socket.socketpair()
    agent = sealed.SealedSocket(a, SESSION_KEY, sealed.AGENT, sha256=auth._sha256)
    client = sealed.SealedSocket(b, SESSION_KEY, sealed.CLIENT, sha256=hashlib.sha256)
    with agent, client:
        client.sendall(b"request")
        assert agent.recv(100) == b"request"
        agent.sendall(b"reply" * 1000)
        client.settimeout(5)
        assert client.recv(10000) == b"reply" * 1000
