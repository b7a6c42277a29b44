"""Silent, slow and greedy connections never lock a real client out of the agent, and never
cost the job memory for bytes that have not arrived (issue 11, item 5)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from typing import Iterator, List

import pytest

from probing.errors import ExitCode
from probing.protocol.frames import (
    MAGIC,
    MAX_REPLY_BYTES,
    PREFIX,
    Frame,
    encode_header,
    recv_frame,
    send_frame,
)
from probing.protocol.messages import PROTOCOL_VERSION, request

from support import PROBING, Target, probing


@pytest.fixture
def sleeper() -> Iterator[Target]:
    with Target("sleeper.py") as started:
        yield started


def socket_path(target: Target) -> str:
    directory = os.environ.get("PROBING_SOCKET_DIR") or f"/tmp/probing-{os.geteuid()}"
    return os.path.join(directory, f"{target.pid}.sock")


def connect(target: Target, count: int) -> List[socket.socket]:
    """`count` connections; a full listen backlog (EAGAIN) is retried until the agent has
    accepted what came before, for at most 5 s."""
    opened = []
    deadline = time.monotonic() + 5
    while len(opened) < count:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        try:
            sock.connect(socket_path(target))
        except BlockingIOError:
            sock.close()
            assert time.monotonic() < deadline, f"only {len(opened)} of {count} connections accepted"
            time.sleep(0.01)
            continue
        opened.append(sock)
    return opened


def close_all(socks: List[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1])


def set_agent(target: Target, assignment: str) -> None:
    result = probing(str(target.pid), "eval", f"import probing.agent.server as server; server.{assignment}")
    assert result.returncode == 0, result.stderr


def read_reply(sock: socket.socket) -> Frame:
    frame = recv_frame(sock, MAX_REPLY_BYTES)
    assert frame is not None
    return frame


@pytest.mark.parametrize("count", [16, 40])
def test_silent_connections_never_keep_backtrace_from_the_agent(sleeper: Target, count: int) -> None:
    silent = connect(sleeper, count)
    try:
        started = time.monotonic()
        result = probing(str(sleeper.pid), "backtrace", timeout=30)
        elapsed = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        # From the agent: a fallback would say "answered from outside the process".
        assert result.stderr == "" and "main_loop" in result.stdout
        assert elapsed < 3, elapsed
        assert probing(str(sleeper.pid), "eval", "1").stdout == "1\n"
    finally:
        close_all(silent)
    assert sleeper.alive()


def test_a_connection_that_sends_nothing_is_closed_at_the_hello_deadline(sleeper: Target) -> None:
    set_agent(sleeper, "HELLO_TIMEOUT_S = 0.5")
    (silent,) = connect(sleeper, 1)
    try:
        started = time.monotonic()
        reply = read_reply(silent)
        assert time.monotonic() - started < 4
        assert reply.header["error"]["type"] == "Timeout"
        assert "no request within 0.5 s of connecting" in reply.header["error"]["message"]
        assert silent.recv(1) == b""  # closed
    finally:
        silent.close()
        set_agent(sleeper, "HELLO_TIMEOUT_S = 5.0")


def test_a_slowloris_frame_is_cut_off_at_the_frame_deadline(sleeper: Target) -> None:
    set_agent(sleeper, "FRAME_TIMEOUT_S = 0.5")
    (slow,) = connect(sleeper, 1)
    try:
        hello = encode_header(request(1, "hello", {"protocol": PROTOCOL_VERSION}))
        slow.sendall(PREFIX.pack(MAGIC, len(hello), 0) + hello)
        assert read_reply(slow).header["ok"] is True
        ping = PREFIX.pack(MAGIC, 100, 0) + b'{"id": 2, "method": "ping"'
        started = time.monotonic()
        # A byte every 0.1 s: each recv() alone is quick, only a deadline over the frame ends it.
        for byte in ping:
            try:
                slow.sendall(bytes([byte]))
            except OSError:
                break
            if time.monotonic() - started > 3:
                break
            time.sleep(0.1)
        reply = read_reply(slow)
        assert reply.header["error"]["type"] == "Timeout"
        assert "not finished within 0.5 s" in reply.header["error"]["message"]
        assert time.monotonic() - started < 4
    finally:
        slow.close()
        set_agent(sleeper, "FRAME_TIMEOUT_S = 15.0")
    assert probing(str(sleeper.pid), "eval", "1").stdout == "1\n"


def test_frames_announcing_16_mb_cost_the_job_no_memory(sleeper: Target) -> None:
    assert probing(str(sleeper.pid), "eval", "1").returncode == 0  # the agent's modules are loaded
    before = rss_kb(sleeper.pid)
    announcing = connect(sleeper, 40)
    try:
        for sock in announcing:
            try:
                sock.sendall(PREFIX.pack(MAGIC, 100, (16 << 20) - 100) + b'{"id": 1')
            except OSError:
                pass  # evicted already: that is the point
        # Every connection has been read from (or evicted) once the agent answers after them.
        assert probing(str(sleeper.pid), "eval", "1").stdout == "1\n"
        grown = rss_kb(sleeper.pid) - before
        assert grown < 8 * 1024, f"RSS grew by {grown} kB"
    finally:
        close_all(announcing)
    assert sleeper.alive()


def test_when_every_connection_runs_a_request_the_cli_says_who(sleeper: Target) -> None:
    busy = connect(sleeper, 16)
    try:
        for number, sock in enumerate(busy):
            code = "import time; time.sleep(6)"
            send_frame(sock, request(number, "eval", {"code": code, "timeout": 8}))
        eval_result = probing(str(sleeper.pid), "eval", "1", timeout=30)
        assert eval_result.returncode == ExitCode.ERROR
        assert "the agent serves 16 connections, all running a request: eval for" in eval_result.stderr
        assert f"(PID {os.getpid()})" in eval_result.stderr
        backtrace = probing(str(sleeper.pid), "backtrace", timeout=30)
        assert backtrace.returncode == 0, backtrace.stderr
        assert "all running a request" in backtrace.stderr
        assert "answered from outside the process (py-spy)" in backtrace.stderr
    finally:
        close_all(busy)
    assert sleeper.alive()


def test_a_repl_whose_idle_connection_was_evicted_carries_on() -> None:
    with Target("stepper.py") as stepper:
        client = subprocess.Popen(
            [PROBING, str(stepper.pid), "repl"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        silent: List[socket.socket] = []
        try:
            assert client.stdin is not None and client.stdout is not None
            client.stdin.write("x = 41\nx\n")
            client.stdin.flush()
            assert client.stdout.readline() == "41\n"
            # The repl's connection is now the longest idle one: 16 newcomers take every slot.
            silent = connect(stepper, 16)
            assert probing(str(stepper.pid), "eval", "1").stdout == "1\n"
            client.stdin.write("x + 1\n")
            client.stdin.close()
            assert client.stdout.readline() == "42\n"
            assert client.wait(15) == 0
        finally:
            close_all(silent)
            if client.poll() is None:
                client.kill()
                client.wait(5)
