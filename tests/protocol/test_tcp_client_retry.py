"""The CLI's side of a flooded agent (client/tcp.py, issue 25 item 10): a connection the agent
resets before its verdict is tried again, a few times and within the command's time; a
connection that brings no challenge (a full accept queue dropped its SYN or its last ACK) is
started afresh sooner than the kernels would resend; anything else is the answer at once.
Against a scripted agent on loopback that plays each part."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Iterator, List, Optional

import pytest

from probing.client import tcp
from probing.errors import AgentUnreachable, BadReply
from probing.protocol import auth

from support import recv_exactly

TOKEN = "the job's shared secret, 32 chars"
KEY = auth.key_of(TOKEN)
RESET_ON_CLOSE = struct.pack("ii", 1, 0)


class ScriptedAgent:
    """Accepts connections and plays `parts` in turn: "reset" (a reset at once, as a flooded
    agent's listener does when it has no room), "eof" (hangs up), "silent" (says nothing until
    the client hangs up), "agent" (a real handshake). `listener`: one to serve, from `after` s."""

    def __init__(
        self, parts: List[str], listener: Optional[socket.socket] = None, after: float = 0.0
    ) -> None:
        self.parts = parts
        self.served: List[str] = []
        self.listener = listener or socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.after = after
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        time.sleep(self.after)
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            part = self.parts[min(len(self.served), len(self.parts) - 1)]
            self.served.append(part)
            with conn:
                conn.settimeout(5)
                if part == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
                elif part == "silent":
                    conn.recv(1)
                elif part == "agent":
                    nonce, challenge = auth.challenge()
                    conn.sendall(challenge)
                    _, verdict = auth.verdict(KEY, nonce, recv_exactly(conn, auth.RESPONSE_BYTES))
                    conn.sendall(verdict)
                    conn.recv(1)  # until the client hangs up

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(5)


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auth.TOKEN_ENV, TOKEN)


def scripted(
    parts: List[str], listener: Optional[socket.socket] = None, after: float = 0.0
) -> Iterator[ScriptedAgent]:
    agent = ScriptedAgent(parts, listener, after)
    try:
        yield agent
    finally:
        agent.close()


def test_a_connection_reset_before_the_verdict_is_tried_again_and_a_hang_up_is_not() -> None:
    for agent in scripted(["reset", "reset", "agent"]):
        said: List[str] = []
        sock = tcp.open_authenticated(agent.url, 10.0, said.append)
        sock.close()
        assert agent.served == ["reset", "reset", "agent"]
        assert sum("trying again" in line for line in said) == 2, said
    # A reset is a flooded agent's; a peer that just hangs up is no agent of ours.
    for agent in scripted(["eof", "agent"]):
        with pytest.raises(BadReply, match="hung up without a challenge"):
            tcp.open_authenticated(agent.url, 10.0, lambda _: None)
        assert agent.served == ["eof"]


def test_resets_that_go_on_end_in_the_error_after_a_bounded_number_of_tries_in_time() -> None:
    for agent in scripted(["reset"]):
        started = time.monotonic()
        with pytest.raises(AgentUnreachable, match="broke the connection"):
            tcp.open_authenticated(agent.url, 10.0, lambda _: None)
        took = time.monotonic() - started
        assert len(agent.served) == len(tcp.DROPPED_RETRY_PAUSES_S) + 1
        assert sum(tcp.DROPPED_RETRY_PAUSES_S) <= took < sum(tcp.DROPPED_RETRY_PAUSES_S) + 3
    for agent in scripted(["reset"]):
        started = time.monotonic()
        with pytest.raises(AgentUnreachable, match="broke the connection"):
            tcp.open_authenticated(agent.url, 0.3, lambda _: None)
        assert time.monotonic() - started < 0.3 + 0.2  # no pause outlasts the command's time
        assert len(agent.served) <= 3


def test_a_connection_that_brings_no_challenge_is_started_afresh() -> None:
    """What a client sees when a full accept queue dropped the ACK that completes its connection:
    connected, and no challenge; the agent's kernel sends its SYN-ACK again only after 1 s."""
    for agent in scripted(["silent", "agent"]):
        said: List[str] = []
        started = time.monotonic()
        tcp.open_authenticated(agent.url, 5.0, said.append).close()
        assert time.monotonic() - started < 1.0
        assert agent.served == ["silent", "agent"]
        assert any("no challenge in 0.25 s; connecting afresh" in line for line in said), said


def test_a_syn_dropped_by_a_full_accept_queue_is_sent_again_sooner_than_the_kernel_would() -> None:
    """With its accept queue full, the kernel drops a SYN, and the client's kernel sends it again
    only after 1 s; the CLI connects afresh after 0.25 s instead."""
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)  # room for one connection not yet accepted
    with socket.create_connection(full.getsockname(), timeout=5):  # takes it
        for agent in scripted(["eof", "agent"], full, after=0.1):
            started = time.monotonic()
            tcp.open_authenticated(agent.url, 5.0, lambda _: None).close()
            took = time.monotonic() - started
    assert took < 0.8, f"authenticated after {took:.2f} s: the kernel's own SYN retry came first"
