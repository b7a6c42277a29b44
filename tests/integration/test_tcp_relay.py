"""A relay between the CLI and a listening job (review of issue 14, finding 1): it passes the
token handshake along untouched, so it holds a connection the agent has authenticated. Every
byte after the handshake is sealed under that connection's own key (protocol/sealed.py): what the
relay injects runs nothing, a byte it flips ends the connection with a clear error, and a relay
that only forwards changes nothing. All on 127.0.0.1; the relay is bounded in connections and time."""

from __future__ import annotations

import secrets
import socket
import struct
import threading
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import pytest

from probing.client.connection import Client
from probing.client.discovery import locate_socket
from probing.errors import ExitCode
from probing.protocol import auth
from probing.protocol.frames import frame_buffers
from probing.protocol.messages import PROTOCOL_VERSION, request

from support import Target, probing

TOKEN = secrets.token_hex(16)
TOKEN_ENV = {"PROBING_TOKEN": TOKEN}
# Bytes of the handshake in each direction: after them the agent's records begin.
AGENT_HANDSHAKE_BYTES = auth.CHALLENGE_BYTES + auth.VERDICT_BYTES
CLIENT_HANDSHAKE_BYTES = auth.RESPONSE_BYTES
TO_AGENT, TO_CLIENT = "to agent", "to client"

# (direction, bytes of that direction already passed, the chunk) -> what to pass on instead.
Rewrite = Callable[[str, int, bytes], bytes]


class Relay:
    """A TCP relay on 127.0.0.1 to the agent's port: a thread per direction per connection,
    at most MAX_CONNECTIONS connections, every socket with a timeout."""

    MAX_CONNECTIONS = 4

    def __init__(self, agent: Tuple[str, int], rewrite: Optional[Rewrite] = None) -> None:
        self.agent = agent
        self.rewrite = rewrite
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(30)
        self.url = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: List[socket.socket] = []
        self.threads: List[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        for _ in range(self.MAX_CONNECTIONS):
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            agent = socket.create_connection(self.agent, timeout=30)
            client.settimeout(30)
            self.sockets += [client, agent]
            for source, sink, direction in ((client, agent, TO_AGENT), (agent, client, TO_CLIENT)):
                pump = threading.Thread(target=self._pump, args=(source, sink, direction), daemon=True)
                self.threads.append(pump)
                pump.start()

    def _pump(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        passed = 0
        try:
            while True:
                chunk = source.recv(1 << 16)
                if not chunk:
                    break
                out = self.rewrite(direction, passed, chunk) if self.rewrite else chunk
                passed += len(chunk)
                sink.sendall(out)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            sock.close()
        for thread in [self._acceptor, *self.threads]:
            thread.join(5)


@pytest.fixture(scope="module")
def job() -> Iterator[Target]:
    with Target("sleeper.py", via="env", env=dict(TOKEN_ENV, PROBING_LISTEN="127.0.0.1:0")) as target:
        yield target


@pytest.fixture(scope="module")
def agent_address(job: Target) -> Tuple[str, int]:
    with Client(locate_socket(job.pid), 10.0, pid=job.pid) as client:
        client.call("ping")
        listener = client.info["listener"]
    host, _, port = str(listener["endpoint"]).rpartition(":")
    return host, int(port)


def relayed(agent_address: Tuple[str, int], rewrite: Optional[Rewrite] = None) -> Iterator[Relay]:
    relay = Relay(agent_address, rewrite)
    try:
        yield relay
    finally:
        relay.close()


def injecting(frames: bytes) -> Rewrite:
    """Passes the handshake, then puts `frames` in front of everything the client sends."""
    done: List[bool] = []

    def rewrite(direction: str, passed: int, chunk: bytes) -> bytes:
        cut = CLIENT_HANDSHAKE_BYTES - passed
        if direction != TO_AGENT or done or not 0 <= cut <= len(chunk):
            return chunk
        done.append(True)
        return chunk[:cut] + frames + chunk[cut:]

    return rewrite


def flipping(direction_flipped: str, offset: int) -> Rewrite:
    """Flips one bit of the byte `offset` bytes into the records of one direction."""
    handshake = AGENT_HANDSHAKE_BYTES if direction_flipped == TO_CLIENT else CLIENT_HANDSHAKE_BYTES

    def rewrite(direction: str, passed: int, chunk: bytes) -> bytes:
        at = handshake + offset - passed
        if direction != direction_flipped or not 0 <= at < len(chunk):
            return chunk
        return chunk[:at] + bytes([chunk[at] ^ 0x01]) + chunk[at + 1 :]

    return rewrite


def eval_frames(marker: Path) -> bytes:
    code = f"open({str(marker)!r}, 'w').close()"
    return b"".join(
        frame_buffers(request(900 + index, method, params))[0]
        for index, (method, params) in enumerate(
            [("hello", {"protocol": PROTOCOL_VERSION}), ("eval", {"code": code})]
        )
    )


def test_a_relay_that_only_forwards_changes_nothing(agent_address: Tuple[str, int]) -> None:
    for relay in relayed(agent_address):
        result = probing(relay.url, "backtrace", env=TOKEN_ENV, timeout=60)
        assert result.returncode == ExitCode.OK, result.stderr
        assert "main_loop" in result.stdout
        result = probing(relay.url, "eval", "6 * 7", env=TOKEN_ENV, timeout=60)
        assert result.returncode == ExitCode.OK and result.stdout.strip() == "42", result.stderr


@pytest.mark.parametrize("shape", ["frames", "record"])
def test_what_a_relay_injects_after_the_handshake_runs_nothing(
    job: Target, agent_address: Tuple[str, int], tmp_path: Path, shape: str
) -> None:
    """The relay passes a real CLI's handshake along, then sends an eval of its own: as plain
    frames (as before sealing), or dressed as a record with a MAC made without the key."""
    marker = tmp_path / "injected-eval-ran"
    frames = eval_frames(marker)
    injected = frames if shape == "frames" else struct.pack(">I", len(frames)) + frames + bytes(32)
    for relay in relayed(agent_address, injecting(injected)):
        result = probing(relay.url, "eval", "1 + 1", env=TOKEN_ENV, timeout=60)
        assert result.returncode != ExitCode.OK, result.stdout
        assert "closed the connection" in result.stderr or "broke the connection" in result.stderr
    assert not marker.exists()
    assert job.alive()
    # The job runs on, and its agent still answers a client that reaches it directly.
    host, port = agent_address
    result = probing(f"tcp://{host}:{port}", "eval", "1 + 1", env=TOKEN_ENV, timeout=60)
    assert result.returncode == ExitCode.OK and result.stdout.strip() == "2", result.stderr


def test_a_byte_flipped_towards_the_cli_is_reported_as_tampering(
    job: Target, agent_address: Tuple[str, int]
) -> None:
    for relay in relayed(agent_address, flipping(TO_CLIENT, 10)):
        result = probing(relay.url, "backtrace", env=TOKEN_ENV, timeout=60)
        assert result.returncode == ExitCode.BAD_REPLY, result.stderr
        assert f"the connection to {relay.url} was tampered with (a record failed its check)" in result.stderr
    assert job.alive()


def test_a_byte_flipped_towards_the_agent_runs_nothing(
    job: Target, agent_address: Tuple[str, int], tmp_path: Path
) -> None:
    marker = tmp_path / "flipped-eval-ran"
    code = f"open({str(marker)!r}, 'w').close()"
    # Byte 40 of the client's first record (its hello and the eval): a changed byte of a request.
    for relay in relayed(agent_address, flipping(TO_AGENT, 40)):
        result = probing(relay.url, "eval", code, env=TOKEN_ENV, timeout=60)
        assert result.returncode != ExitCode.OK, result.stdout
    assert not marker.exists()
    assert job.alive()
