"""A node's relay (agent/relay.py): one agent asks other agents of its node, over their Unix
sockets, what the CLI would have asked each, and passes every reply on as it came. What it
reaches is checked (this user's sockets in its own folder, answered by the PID named), what it
refuses is refused before anything is sent, and a rank that does not answer in time is named
while the others are answered.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from probing.client.connection import Client
from probing.client.discovery import locate_socket
from probing.client.replies import decode_reply_table
from probing.errors import RequestRefused
from probing.protocol.messages import parse_reply

from support import Target


@pytest.fixture(scope="module")
def three() -> Iterator[List[Target]]:
    targets: List[Target] = []
    try:
        for _ in range(3):
            targets.append(Target("sleeper.py"))
        yield targets
    finally:
        for target in targets:
            target.kill()


def relay(through: Target, calls: List[Any], timeout: float = 10.0) -> Tuple[Dict[str, Any], bytearray]:
    with Client(locate_socket(through.pid), timeout + 5, pid=through.pid) as client:
        return client.call("relay", {"calls": calls, "timeout": timeout}, timeout=timeout + 5)


def test_every_reply_is_passed_on_as_its_agent_sent_it(three: List[Target]) -> None:
    relay_rank, *others = three
    calls = [{"pid": other.pid, "method": "backtrace", "params": {}} for other in others]
    calls.append({"pid": relay_rank.pid, "method": "ping"})  # the relay's own agent, like any other
    result, payload = relay(relay_rank, calls)
    replies = result["replies"]
    assert [entry["pid"] for entry in replies] == [call["pid"] for call in calls]
    for entry, target in zip(replies[:2], others):
        _, ok, hello = parse_reply(entry["hello"])
        assert ok and hello["pid"] == target.pid
        reply_id, ok, body = parse_reply(entry["reply"])
        assert (reply_id, ok) == (2, True)
        chunk = payload[entry["offset"] : entry["offset"] + entry["size"]]
        table = decode_reply_table(body, bytearray(chunk))
        assert {row["pid"] for row in table.to_rows()} == {target.pid}
        assert "main_loop" in {row["func"] for row in table.to_rows()}
    assert parse_reply(replies[2]["reply"])[1] is True


@pytest.mark.parametrize(
    "calls, why",
    [
        ([], "calls must be a list of 1 to 1024 requests"),
        ([{"pid": 1, "method": "ping"}] * 1025, "calls must be a list of 1 to 1024 requests"),
        ([{"pid": 1, "method": "relay"}], "a call's method cannot be relayed: 'relay'"),
        ([{"pid": 1, "method": "hello"}], "a call's method cannot be relayed: 'hello'"),
        ([{"pid": "1", "method": "ping"}], "each call needs the pid of a process of this node"),
        ([{"pid": True, "method": "ping"}], "each call needs the pid of a process of this node"),
        ([{"pid": 1, "method": "ping", "params": []}], "a call's method cannot be relayed"),
    ],
)
def test_a_request_the_relay_refuses_sends_nothing(three: List[Target], calls: List[Any], why: str) -> None:
    with pytest.raises(RequestRefused, match=why.replace("(", r"\(")):
        relay(three[0], calls)


@contextlib.contextmanager
def socket_at(path: str) -> Iterator[socket.socket]:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    try:
        yield listener
    finally:
        listener.close()
        os.unlink(path)


def test_only_this_users_agents_answering_as_the_pid_named_are_asked(three: List[Target]) -> None:
    """No agent at all; a socket of another user's; a socket of this user's that another
    process answers (this test's): each is named, nothing was sent, the rest is answered."""
    directory = os.environ["PROBING_SOCKET_DIR"]
    others_pid, impostor_pid = three[1].pid, os.getppid()
    with socket_at(os.path.join(directory, f"{os.getpid()}.sock")):
        os.chown(os.path.join(directory, f"{os.getpid()}.sock"), 65534, 65534)
        with socket_at(os.path.join(directory, f"{impostor_pid}.sock")):
            pids = (99999999, os.getpid(), impostor_pid, others_pid)
            result, _ = relay(three[0], [{"pid": pid, "method": "ping"} for pid in pids], timeout=5)
    missing, foreign, impostor, answered = result["replies"]
    assert missing["error"].startswith("no agent socket at ") and missing["sent"] is False
    assert foreign["error"].endswith("is not a socket of this user's") and foreign["sent"] is False
    assert f"is answered by PID {os.getpid()}" in impostor["error"] and impostor["sent"] is False
    assert parse_reply(answered["reply"])[1] is True


def test_a_rank_that_does_not_answer_in_time_is_named_and_the_others_are_answered(
    three: List[Target],
) -> None:
    relay_rank, stopped, running = three
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        calls = [{"pid": stopped.pid, "method": "backtrace"}, {"pid": running.pid, "method": "backtrace"}]
        result, _ = relay(relay_rank, calls, timeout=1.5)
        took = time.monotonic() - started
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    late, answered = result["replies"]
    assert (late["sent"], late["error"]) == (True, "no answer in time")
    assert parse_reply(answered["reply"])[1] is True
    assert 1.4 < took < 3.0
    assert relay_rank.alive() and stopped.alive() and running.alive()
