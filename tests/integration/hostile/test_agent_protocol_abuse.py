"""What held under protocol abuse, kept so (issue 11, "What held"): random bytes, truncated
frames, huge lengths, malformed headers, pipelined pings and connect/close storms, each
followed by a real `probing PID eval 1` that answers quickly, with the job alive. Bounded
versions of the experiments: tens of frames, not hundreds."""

from __future__ import annotations

import os
import random
import socket
import time
from typing import Callable, Iterator

import pytest

from probing.protocol.frames import (
    MAGIC,
    MAX_HEADER_BYTES,
    MAX_REPLY_BYTES,
    MAX_REQUEST_BYTES,
    PREFIX,
    FrameReader,
    encode_header,
    recv_frame,
)
from probing.protocol.messages import request

from support import Target, probing


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    with Target("sleeper.py") as started:
        yield started


def socket_path(target: Target) -> str:
    directory = os.environ.get("PROBING_SOCKET_DIR") or f"/tmp/probing-{os.geteuid()}"
    return os.path.join(directory, f"{target.pid}.sock")


def connection(target: Target) -> socket.socket:
    deadline = time.monotonic() + 5
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        try:
            sock.connect(socket_path(target))
            return sock
        except BlockingIOError:  # a full listen backlog during a storm: the agent catches up
            sock.close()
            assert time.monotonic() < deadline
            time.sleep(0.01)


def send_and_close(target: Target, data: bytes) -> None:
    with connection(target) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass  # the agent may close first: it has seen enough


def assert_answers_quickly(target: Target) -> None:
    started = time.monotonic()
    result = probing(str(target.pid), "eval", "1")
    assert (result.returncode, result.stdout) == (0, "1\n"), result.stderr
    assert time.monotonic() - started < 3
    assert target.alive()


def frame(header: bytes, payload: bytes = b"") -> bytes:
    return PREFIX.pack(MAGIC, len(header), len(payload)) + header + payload


def random_bytes(rng: random.Random, target: Target) -> None:
    for _ in range(40):
        send_and_close(target, bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))))


def truncated_frames(rng: random.Random, target: Target) -> None:
    whole = frame(encode_header(request(1, "eval", {"code": "1"})))
    for _ in range(40):
        send_and_close(target, whole[: rng.randint(1, len(whole) - 1)])


def huge_lengths(rng: random.Random, target: Target) -> None:
    for _ in range(30):
        header_length = rng.choice([MAX_HEADER_BYTES + 1, 2**32 - 1, 1000])
        payload_length = rng.choice([0, 2**32 - 1, MAX_REQUEST_BYTES, 2**31])
        send_and_close(target, PREFIX.pack(MAGIC, header_length, payload_length) + b"{")


def malformed_headers(rng: random.Random, target: Target) -> None:
    headers = [
        b"{", b"[]", b"null", b'"text"', b"\xff\xfe", b'{"method": 3}', b'{"id": [], "method": "ping"}',
        b'{"method": "ping", "params": []}', b'{"method": "eval", "params": {"code": null}}', b"{}",
    ]  # fmt: skip
    with connection(target) as sock:
        for header in headers * 3:
            sock.sendall(frame(header))
            reply = recv_frame(sock, MAX_REPLY_BYTES)
            assert reply is not None and reply.header["ok"] is False  # an error, and the line stays up


def pipelined_pings(rng: random.Random, target: Target) -> None:
    count = 2000
    ping = frame(encode_header(request(1, "ping")))
    with connection(target) as sock:
        sock.sendall(ping * count)
        reader = FrameReader(sock, MAX_REPLY_BYTES)
        for _ in range(count):
            reply = reader.read()
            assert reply is not None and reply.header["result"] == {"pong": True}


def connect_close_storm(rng: random.Random, target: Target) -> None:
    for _ in range(200):
        connection(target).close()


@pytest.mark.parametrize(
    "abuse",
    [random_bytes, truncated_frames, huge_lengths, malformed_headers, pipelined_pings, connect_close_storm],
)
def test_the_agent_answers_quickly_after(
    target: Target, abuse: Callable[[random.Random, Target], None]
) -> None:
    abuse(random.Random(11), target)
    assert_answers_quickly(target)
