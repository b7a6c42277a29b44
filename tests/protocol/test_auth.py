"""The shared token and the TCP handshake: where the token comes from and which files are
refused, the challenge-response on its own, and the agent's listener (its selector thread, in
this process, on loopback) against scripted peers: accepted, refused, replayed, silent, flooded
(from one source and from others, half-way, trickling: issue 25, item 10)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Iterator, List, Optional, Set, Tuple

import pytest

from probing.agent.connections import Connection, busy_message
from probing.agent.listener import acceptor, handshakes
from probing.agent.listener.acceptor import TcpListener
from probing.agent.listener.address import AddressError, bind_tcp, parse_listen_address
from probing.protocol import auth

from support import recv_exactly, wait_until

TOKEN = "correct horse battery staple"
KEY = auth.key_of(TOKEN)


# --- where the token comes from ---------------------------------------------------------------


def token_file(directory: Path, text: str = TOKEN, mode: int = 0o600) -> Path:
    path = directory / "token"
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_the_environment_token_comes_first_and_is_stripped(tmp_path: Path) -> None:
    path = token_file(tmp_path, "a file token of sixteen+")
    env = {auth.TOKEN_ENV: f"  {TOKEN}\n", auth.TOKEN_FILE_ENV: str(path)}
    assert auth.load_token(env) == TOKEN


def test_a_short_token_is_refused_wherever_it_comes_from(tmp_path: Path) -> None:
    with pytest.raises(auth.TokenError, match="too short: 16 characters"):
        auth.load_token({auth.TOKEN_ENV: "short"})
    path = token_file(tmp_path, "short")
    with pytest.raises(auth.TokenError, match="too short"):
        auth.load_token({auth.TOKEN_FILE_ENV: str(path)})


def test_a_0600_token_file_of_ones_own_is_read(tmp_path: Path) -> None:
    assert auth.load_token({auth.TOKEN_FILE_ENV: str(token_file(tmp_path))}) == TOKEN


def test_the_default_token_file_is_in_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(
        auth.TokenError, match=r"no token: \$PROBING_TOKEN is not set and there is no .*/\.probing/token"
    ):
        auth.load_token({})
    (tmp_path / ".probing").mkdir()
    token_file(tmp_path / ".probing")
    assert auth.load_token({}) == TOKEN


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = token_file(tmp_path, mode=0o644)
    with pytest.raises(auth.TokenError, match=r"open to others \(mode 0644\); chmod 600"):
        auth.load_token({auth.TOKEN_FILE_ENV: str(path)})
    path.chmod(0o620)
    with pytest.raises(auth.TokenError, match="open to others"):
        auth.load_token({auth.TOKEN_FILE_ENV: str(path)})


def test_a_token_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = token_file(tmp_path)
    other = 65534 if os.geteuid() != 65534 else 65533
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    os.chown(path, other, other)
    with pytest.raises(auth.TokenError, match=f"belongs to uid {other}, not to uid {os.geteuid()}"):
        auth.load_token({auth.TOKEN_FILE_ENV: str(path)})


def test_a_symlinked_token_file_is_refused(tmp_path: Path) -> None:
    """Someone who can plant a link in a shared home must not choose the token we read."""
    target = token_file(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(auth.TokenError, match="cannot read the token file"):
        auth.load_token({auth.TOKEN_FILE_ENV: str(link)})


def test_a_token_path_that_is_no_regular_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(auth.TokenError, match="not a regular file"):
        auth.load_token({auth.TOKEN_FILE_ENV: str(tmp_path)})


# --- the handshake as functions ----------------------------------------------------------------


def test_the_right_token_is_accepted_and_the_agent_proves_it_too() -> None:
    agent_nonce, challenge = auth.challenge()
    assert len(challenge) == auth.CHALLENGE_BYTES
    nonce, response = auth.respond(KEY, challenge)
    assert nonce == agent_nonce and len(response) == auth.RESPONSE_BYTES
    accepted, verdict = auth.verdict(KEY, agent_nonce, response)
    assert accepted and len(verdict) == auth.VERDICT_BYTES
    auth.check_verdict(KEY, nonce, response, verdict)  # raises if the agent's proof is wrong


def test_a_wrong_token_is_refused() -> None:
    agent_nonce, challenge = auth.challenge()
    nonce, response = auth.respond(auth.key_of("another token, also long"), challenge)
    accepted, verdict = auth.verdict(KEY, agent_nonce, response)
    assert not accepted and verdict == auth.REFUSED + bytes(auth.MAC_BYTES)
    with pytest.raises(auth.HandshakeError) as caught:
        auth.check_verdict(KEY, nonce, response, verdict)
    assert caught.value.refused


def test_a_recorded_response_fails_against_a_new_challenge() -> None:
    first_nonce, first = auth.challenge()
    _, recorded = auth.respond(KEY, first)
    assert auth.verdict(KEY, first_nonce, recorded)[0]
    second_nonce, _ = auth.challenge()
    assert not auth.verdict(KEY, second_nonce, recorded)[0]


def test_an_agent_that_does_not_know_the_token_cannot_pose_as_one() -> None:
    agent_nonce, challenge = auth.challenge()
    nonce, response = auth.respond(KEY, challenge)
    _, forged = auth.verdict(auth.key_of("the impostor's own token"), agent_nonce, response)
    forged = auth.ACCEPTED + forged[1:]
    with pytest.raises(auth.HandshakeError, match="not the job's agent"):
        auth.check_verdict(KEY, nonce, response, forged)


def test_a_peer_that_sends_no_challenge_is_no_agent() -> None:
    with pytest.raises(auth.HandshakeError, match="not a probing agent"):
        auth.respond(KEY, b"SSH-2.0-OpenSSH_9.6\r\n" + bytes(19))


# --- listen addresses ---------------------------------------------------------------------------


def test_listen_addresses_and_the_local_rank_offset() -> None:
    assert parse_listen_address("auto", {}) == ("0.0.0.0", 0)
    assert parse_listen_address("47001", {"LOCAL_RANK": "3"}) == ("0.0.0.0", 47004)
    assert parse_listen_address("127.0.0.2:0", {"LOCAL_RANK": "3"}) == ("127.0.0.2", 0)
    assert parse_listen_address("[::1]:5000", {}) == ("::1", 5000)
    for bad in ("host:port", "::1:5000", "70000", "", "127.0.0.1:"):
        with pytest.raises(AddressError):
            parse_listen_address(bad, {})


# --- the listener against scripted peers ---------------------------------------------------------


class FakeServer:
    """Stands for the agent's server: records what the listener hands over."""

    def __init__(self) -> None:
        self.own_threads: Set[int] = set()
        self.admitted: List[Tuple[socket.socket, str]] = []
        self.event = threading.Event()

    def admit_authenticated(self, conn: socket.socket, peer: str) -> None:
        self.admitted.append((conn, peer))
        self.event.set()


@pytest.fixture
def table_size() -> Optional[int]:
    """How many handshakes the listener keeps at once (a test parametrizes it); None: the usual."""
    return None


@pytest.fixture
def listening(
    table_size: Optional[int], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Tuple[TcpListener, FakeServer, Tuple[str, int]]]:
    if table_size is not None:
        monkeypatch.setattr(acceptor, "capacity", lambda: table_size)
    server = FakeServer()
    listener = TcpListener(server, bind_tcp("127.0.0.1", 0, acceptor.BACKLOG), TOKEN)
    listener.start()
    address = listener.sock.getsockname()
    yield listener, server, (str(address[0]), int(address[1]))
    listener.stop()
    for conn, _ in server.admitted:
        conn.close()


def connect(address: Tuple[str, int], source: str = "127.0.0.1") -> socket.socket:
    """A connection to the listener from `source` (any 127.0.0.x is this machine)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.bind((source, 0))
    sock.connect(address)
    return sock


def closed_by_agent(sock: socket.socket) -> bool:
    """The agent ended the connection (a reset, or a FIN after its verdict)."""
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def handshake(sock: socket.socket, key: bytes = KEY) -> Tuple[bytes, bytes, bytes]:
    nonce, response = auth.respond(key, recv_exactly(sock, auth.CHALLENGE_BYTES))
    sock.sendall(response)
    return nonce, response, recv_exactly(sock, auth.VERDICT_BYTES)


def test_the_listener_hands_an_authenticated_peer_to_the_server(
    listening: Tuple[TcpListener, FakeServer, Tuple[str, int]],
) -> None:
    listener, server, address = listening
    with connect(address) as sock:
        nonce, response, verdict = handshake(sock)
        auth.check_verdict(KEY, nonce, response, verdict)
        assert server.event.wait(5)
        conn, peer = server.admitted[0]
        assert peer == f"127.0.0.1:{sock.getsockname()[1]}"
        assert conn.getblocking()
    assert listener.sock.fileno() >= 0 and listener.running()
    assert listener._thread is not None and listener._thread.ident in server.own_threads


def test_a_wrong_token_gets_the_refusal_and_the_connection_ends(
    listening: Tuple[TcpListener, FakeServer, Tuple[str, int]],
) -> None:
    listener, server, address = listening
    with connect(address) as sock:
        _, _, verdict = handshake(sock, auth.key_of("not the job's token at all"))
        assert verdict == auth.REFUSED + bytes(auth.MAC_BYTES)
        sock.sendall(b"anything at all, a request even")
        assert sock.recv(100) == b""  # hung up (after a short linger), nothing answered
    assert not server.admitted


def test_a_response_replayed_on_a_new_connection_is_refused(
    listening: Tuple[TcpListener, FakeServer, Tuple[str, int]],
) -> None:
    _, server, address = listening
    with connect(address) as first:
        _, recorded, verdict = handshake(first)
        assert verdict[:1] == auth.ACCEPTED
    with connect(address) as second:
        recv_exactly(second, auth.CHALLENGE_BYTES)
        second.sendall(recorded)
        assert recv_exactly(second, auth.VERDICT_BYTES)[:1] == auth.REFUSED
    assert len(server.admitted) == 1


def test_a_silent_peer_is_closed_at_the_handshake_deadline(
    monkeypatch: pytest.MonkeyPatch, listening: Tuple[TcpListener, FakeServer, Tuple[str, int]]
) -> None:
    monkeypatch.setattr(acceptor, "HANDSHAKE_TIMEOUT_S", 0.3)
    _, _, address = listening
    with connect(address) as sock:
        assert len(recv_exactly(sock, auth.CHALLENGE_BYTES)) == auth.CHALLENGE_BYTES
        sock.settimeout(5)
        assert closed_by_agent(sock)  # reset by the agent, well before our 5 s


@pytest.mark.parametrize("table_size", [4])
def test_pending_handshakes_are_capped_and_a_sources_oldest_goes(
    listening: Tuple[TcpListener, FakeServer, Tuple[str, int]],
) -> None:
    listener, server, address = listening
    silent = [connect(address) for _ in range(6)]
    try:
        for sock in silent:
            recv_exactly(sock, auth.CHALLENGE_BYTES)  # each has been accepted
        assert closed_by_agent(silent[0]) and closed_by_agent(silent[1])
        assert len(listener._pending) == 4
        with connect(address) as late:
            nonce, response, verdict = handshake(late)
            auth.check_verdict(KEY, nonce, response, verdict)
            assert server.event.wait(5)
    finally:
        for sock in silent:
            sock.close()


def flood(address: Tuple[str, int], source: str, count: int) -> List[socket.socket]:
    """`count` silent connections from `source`, each accepted (its challenge read) in turn."""
    opened = []
    for _ in range(count):
        sock = connect(address, source)
        opened.append(sock)
        try:
            recv_exactly(sock, auth.CHALLENGE_BYTES)
        except ConnectionResetError:
            pass  # already made room for a later one
    return opened


def half_way(listener: TcpListener) -> int:
    """Handshakes of which the listener has read part of a RESPONSE."""
    return sum(1 for entry in list(listener._pending) if entry.received)


@pytest.mark.parametrize("table_size", [4])
def test_a_flood_from_one_source_never_takes_another_sources_handshake(
    listening: Tuple[TcpListener, FakeServer, Tuple[str, int]],
) -> None:
    """The old listener dropped the oldest handshake of all: ten newcomers from anywhere ended
    a client that had not answered yet."""
    listener, server, address = listening
    with connect(address, "127.0.0.1") as client:
        challenge = recv_exactly(client, auth.CHALLENGE_BYTES)
        flooders = flood(address, "127.0.0.2", 40)
        try:
            nonce, response = auth.respond(KEY, challenge)
            client.sendall(response)
            auth.check_verdict(KEY, nonce, response, recv_exactly(client, auth.VERDICT_BYTES))
            assert server.event.wait(5)
            assert closed_by_agent(flooders[0])
        finally:
            for sock in flooders:
                sock.close()


@pytest.mark.parametrize("table_size", [8])
def test_a_half_way_handshake_outlives_a_flood_of_its_own_source(
    listening: Tuple[TcpListener, FakeServer, Tuple[str, int]],
) -> None:
    listener, server, address = listening
    with connect(address, "127.0.0.2") as slow:
        nonce, response = auth.respond(KEY, recv_exactly(slow, auth.CHALLENGE_BYTES))
        slow.sendall(response[:10])
        assert wait_until(lambda: half_way(listener) == 1)
        flooders = flood(address, "127.0.0.2", 30)
        try:
            slow.sendall(response[10:])
            auth.check_verdict(KEY, nonce, response, recv_exactly(slow, auth.VERDICT_BYTES))
            assert server.event.wait(5)
        finally:
            for sock in flooders:
                sock.close()


def test_tricklers_beyond_their_sources_share_are_reset(
    listening: Tuple[TcpListener, FakeServer, Tuple[str, int]],
) -> None:
    listener, _, address = listening
    tricklers = flood(address, "127.0.0.2", handshakes.PROGRESSING_PER_SOURCE + 1)
    try:
        for index, sock in enumerate(tricklers[:-1]):
            sock.sendall(b"x")
            assert wait_until(lambda index=index: half_way(listener) == index + 1)
        tricklers[-1].sendall(b"x")
        assert closed_by_agent(tricklers[-1])
        assert half_way(listener) == handshakes.PROGRESSING_PER_SOURCE
        # Another source keeps its own share.
        with connect(address, "127.0.0.3") as other:
            recv_exactly(other, auth.CHALLENGE_BYTES)
            other.sendall(b"x")
            assert wait_until(lambda: half_way(listener) == handshakes.PROGRESSING_PER_SOURCE + 1)
        # Gone, it is forgotten: `hello` counts the half-way handshakes there are.
        assert wait_until(
            lambda: listener.describe()["handshakes"]["half_way"] == handshakes.PROGRESSING_PER_SOURCE
        )
    finally:
        for sock in tricklers:
            sock.close()


def test_an_answer_that_came_is_read_before_its_slot_is_given_away(monkeypatch: pytest.MonkeyPatch) -> None:
    """The listener's steps driven by hand (no thread): a client's RESPONSE sits unread in the
    kernel's buffer when a burst of newcomers from its own source needs its slot. The old
    listener dropped it unread (the client saw its connection reset)."""
    monkeypatch.setattr(acceptor, "capacity", lambda: 4)
    server = FakeServer()
    listener = TcpListener(server, bind_tcp("127.0.0.1", 0, acceptor.BACKLOG), TOKEN)
    address = listener.sock.getsockname()
    newcomers: List[socket.socket] = []
    try:
        with connect(address) as client:
            listener._accept_some()
            nonce, response = auth.respond(KEY, recv_exactly(client, auth.CHALLENGE_BYTES))
            client.sendall(response)
            newcomers = [connect(address) for _ in range(4)]
            listener._accept_some()
            verdict = recv_exactly(client, auth.VERDICT_BYTES)
            auth.check_verdict(KEY, nonce, response, verdict)
            assert len(server.admitted) == 1
    finally:
        for sock in newcomers:
            sock.close()
        listener.stop()
        for conn, _ in server.admitted:
            conn.close()


def test_stop_closes_the_port_and_the_pending_handshakes(
    listening: Tuple[TcpListener, FakeServer, Tuple[str, int]],
) -> None:
    listener, _, address = listening
    with connect(address) as pending:
        recv_exactly(pending, auth.CHALLENGE_BYTES)
        listener.stop()
        assert pending.recv(10) == b""
    assert listener._thread is not None and not listener._thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        connect(address)


def test_a_tcp_client_is_described_by_its_address_not_a_pid() -> None:
    with socket.socket() as sock:
        record = Connection(sock, None, "10.0.0.5:51234")
        record.busy_since = record.connected_at
        record.method = "eval"
        described = record.describe(record.connected_at + 2)
    assert described["peer"] == "10.0.0.5:51234" and described["pid"] is None
    assert "eval for 2.0 s (from 10.0.0.5:51234)" in busy_message([described])


@pytest.mark.parametrize("key_bytes", [0, 1, 32, 63, 64, 65, 200])
def test_the_built_in_hmac_matches_the_standard_librarys(key_bytes: int) -> None:
    """auth.py computes HMAC-SHA256 without hashlib (which loads OpenSSL into the agent)."""
    import hashlib
    import hmac

    key = bytes(index % 251 for index in range(key_bytes))
    for message in (b"", b"client\x00" + bytes(64), bytes(range(256)) * 3):
        assert auth.hmac_sha256(key, message) == hmac.new(key, message, hashlib.sha256).digest()
    assert auth.key_of(TOKEN) == hashlib.sha256(b"probing-token\x00" + TOKEN.encode()).digest()
