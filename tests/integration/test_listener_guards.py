"""What the agent's TCP side must never do to the job or to itself (issue 14 review): be held by
the job's store when it hangs, touch descriptors the job closed and reused, take a rank's port
in torchrun's launcher, or load the listener (and OpenSSL) in a job that does not listen."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from probing.agent.listener.launcher import LAUNCHER_REFUSAL
from probing.protocol.frames import MAX_REPLY_BYTES, recv_frame, send_frame
from probing.protocol.messages import ErrorKind, request

from support import Target, TorchrunJob, agent_threads, no_request_in_flight, probing, wait_until

TOKEN = "the job's shared secret, 32 chars"
LISTEN = {"PROBING_LISTEN": "127.0.0.1:0", "PROBING_TOKEN": TOKEN}
RANK = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
STORE_SILENT = "did not answer within 3 s"


def unix_call(
    pid: int, method: str, params: Optional[Dict[str, Any]] = None, timeout: float = 30
) -> Dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(os.path.join(os.environ["PROBING_SOCKET_DIR"], f"{pid}.sock"))
        send_frame(sock, request(1, method, params or {}))
        frame = recv_frame(sock, MAX_REPLY_BYTES)
        assert frame is not None, f"the agent closed the connection instead of answering {method}"
        return frame.header


def timed(pid: int, method: str) -> float:
    started = time.monotonic()
    reply = unix_call(pid, method, timeout=10)
    assert reply["ok"], reply
    return time.monotonic() - started


@pytest.fixture
def silent_store() -> Iterator[int]:
    """A "store" that accepts connections (the kernel does, from its backlog) and never answers."""
    with socket.socket() as store:
        store.bind(("127.0.0.1", 0))
        store.listen(128)
        yield int(store.getsockname()[1])


def thread_states(pid: int) -> List[str]:
    """The scheduler state of each thread of `pid` (R, S, T for stopped, ...)."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except OSError:
            continue  # a thread that ended
        states.append(stat[stat.rindex(")") + 2])
    return states


def many_endpoints_then_the_agent_still_answers(pid: int, store_pid: Optional[int] = None) -> None:
    """20 `endpoints` at once against a hung store: each is answered within the deadline (the
    store named), refused at once (busy while 16 wait, or pushed out before its request came
    in: the agent's usual rules for a full house), none held; then hello, backtrace, detach
    answer at once, and the agent ran at most one store thread meanwhile. A stopped store
    (`store_pid`) is seen stopped first, and its threads' states go with any answer it gave."""
    outcomes: List[str] = []
    if store_pid is not None:
        assert wait_until(lambda: set(thread_states(store_pid)) == {"T"}, 10), thread_states(store_pid)

    def ask() -> None:
        try:
            reply = unix_call(pid, "endpoints", timeout=20)
        except (AssertionError, BlockingIOError, ConnectionError) as error:
            outcomes.append(f"refused: {type(error).__name__}")
            return
        if reply["ok"]:
            store = f", the store's threads {thread_states(store_pid)}" if store_pid is not None else ""
            outcomes.append(f"answered {reply['result']}{store}")
        elif reply["error"]["type"] == ErrorKind.NOT_FOUND and STORE_SILENT in reply["error"]["message"]:
            outcomes.append("store silent")
        elif reply["error"]["type"] == ErrorKind.BUSY:
            outcomes.append("refused: busy")
        else:
            outcomes.append(str(reply["error"]))

    started = time.monotonic()
    askers = [threading.Thread(target=ask) for _ in range(20)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(30)
    elapsed = time.monotonic() - started
    print(f"20 endpoints in {elapsed:.1f} s: {dict(Counter(outcomes))}")
    assert len(outcomes) == 20 and elapsed < 8, (elapsed, outcomes)
    assert "store silent" in outcomes and all(
        outcome == "store silent" or outcome.startswith("refused") for outcome in outcomes
    ), outcomes
    names = agent_threads(pid)
    # One store thread, one registering.
    assert names.count("probing-store") <= 1 and names.count("probing-publish") <= 1, names
    assert timed(pid, "hello") < 1.0 and timed(pid, "backtrace") < 2.0
    assert timed(pid, "detach") < 2.5  # its unregister is bounded too


def test_a_store_that_never_answers_holds_nothing(silent_store: int) -> None:
    env = dict(LISTEN, **RANK, MASTER_PORT=str(silent_store))
    with Target("store_rank.py", via="env", env=env) as job:
        hello = unix_call(job.pid, "hello")["result"]
        assert hello["listener"] is not None
        many_endpoints_then_the_agent_still_answers(job.pid)
        assert job.alive()


def test_a_stopped_store_holds_nothing() -> None:
    with Target("store_rank.py", via="plain", args=["--serve"]) as store:
        port = store.ready_line().split()[2]
        with Target("store_rank.py", via="env", env=dict(LISTEN, **RANK, MASTER_PORT=port)) as job:
            assert wait_until(
                lambda: unix_call(job.pid, "hello")["result"]["listener"]["registered"], 30, 0.1
            )
            assert [entry["rank"] for entry in unix_call(job.pid, "endpoints")["result"]["ranks"]] == [0]
            os.kill(store.pid, signal.SIGSTOP)
            try:
                many_endpoints_then_the_agent_still_answers(job.pid, store.pid)
            finally:
                os.kill(store.pid, signal.SIGCONT)
            assert job.alive()


def tell(job: Target, line: str, answer: str) -> str:
    """Send the job a command; its answer: the first line starting with `answer` printed after."""
    assert job.process.stdin is not None
    seen = len(job.stdout_lines)
    job.process.stdin.write(f"{line}\n".encode())
    job.process.stdin.flush()
    fresh = lambda: [out for out in job.stdout_lines[seen:] if out.startswith(answer)]  # noqa: E731
    assert wait_until(fresh, 10), job.output()
    return fresh()[0]


def test_the_agents_sockets_sit_high_where_a_jobs_new_files_never_land() -> None:
    """Every socket of the agent (its Unix and TCP listeners, their wakers, a connection being
    served) is at half the job's limit on descriptors or above: a job that closes every
    descriptor and opens files again gets low numbers, never one an agent thread may still be
    on its way to use (between poll() and recv(): CI once saw the job's socket read there)."""
    with Target("closes_sockets.py", via="env", env=LISTEN) as job:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as held:  # a connection in service
            held.connect(os.path.join(os.environ["PROBING_SOCKET_DIR"], f"{job.pid}.sock"))
            send_frame(held, request(1, "hello", {}))
            assert recv_frame(held, MAX_REPLY_BYTES) is not None
            limits = Path(f"/proc/{job.pid}/limits").read_text()
            soft = int(
                next(line for line in limits.splitlines() if line.startswith("Max open files")).split()[3]
            )
            floor = min(soft, 1 << 16) // 2
            sockets = {
                int(fd): os.readlink(f"/proc/{job.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{job.pid}/fd")
            }
            sockets = {fd: link for fd, link in sockets.items() if link.startswith("socket:")}
            # listener, conn, TCP listener, its waker pair; the job itself has none yet
            assert len(sockets) >= 5 and min(sockets) >= floor, (floor, sockets)


def test_a_job_that_closes_the_listeners_descriptors_keeps_its_own_sockets_intact() -> None:
    """The job closes every descriptor (the listener's port, its waker, its handshakes) and
    puts socketpairs of its own on their numbers: the old listener stops without closing or
    writing any of them, also when a detach stops it, and the job's sockets carry exactly what
    it sent."""
    with Target("closes_sockets.py", via="env", env=LISTEN) as job:
        assert unix_call(job.pid, "hello")["result"]["listener"] is not None
        assert no_request_in_flight(job.pid)
        tell(job, "close", "reopened")
        first = probing(str(job.pid), "backtrace")  # may still reach the old agent (see hostile/)
        assert first.returncode == 0, first.stderr
        again = probing(str(job.pid), "eval", "1")  # a new agent, its own listener
        assert (again.returncode, again.stdout) == (0, "1\n"), again.stderr
        assert tell(job, "check", "sockets") == "sockets ok"
        detached = probing(str(job.pid), "detach")  # stops the old listener too (its stop hook)
        assert detached.returncode == 0, detached.stderr
        assert tell(job, "check", "sockets") == "sockets ok"
        assert job.alive() and not [line for line in job.stderr_lines if line.strip()]


def free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no two free ports in a row")


def test_torchruns_launcher_does_not_take_a_ranks_port() -> None:
    port = free_port_pair()
    env = dict(LISTEN, PROBING="1", PROBING_LISTEN=f"127.0.0.1:{port}")
    with TorchrunJob("healthy", ranks=2, env=env) as job:
        for rank, pid in job.pids.items():
            hello = unix_call(pid, "hello")["result"]
            assert hello["listener"] is not None, hello["listen_error"]
            assert hello["listener"]["endpoint"] == f"127.0.0.1:{port + rank}"
        launcher = unix_call(job.agent_pid, "hello")["result"]
        assert launcher["listener"] is None and launcher["listen_error"] == LAUNCHER_REFUSAL
        assert launcher["rank"] is None


LISTENER_MODULES = (
    "probing.agent.listener.control", "probing.agent.listener.registry", "probing.agent.listener.acceptor",
    "probing.protocol.auth", "_sha256", "_sha2", "hashlib", "_hashlib", "hmac",
)  # fmt: skip
LOADED = f"import sys; sorted(name for name in sys.modules if name in {LISTENER_MODULES!r})"


def test_a_job_that_does_not_listen_loads_nothing_of_the_listener() -> None:
    with Target("stepper.py", via="env") as job:
        assert unix_call(job.pid, "hello")["ok"]
        loaded = probing(str(job.pid), "eval", LOADED)
        assert (loaded.returncode, loaded.stdout) == (0, "[]\n"), loaded.stderr


def test_a_listening_job_never_loads_openssl() -> None:
    with Target("stepper.py", via="env", env=LISTEN) as job:
        assert unix_call(job.pid, "hello")["result"]["listener"] is not None
        loaded = probing(str(job.pid), "eval", LOADED)
        assert loaded.returncode == 0, loaded.stderr
        assert "hashlib" not in loaded.stdout and "hmac" not in loaded.stdout, loaded.stdout
        assert "probing.agent.listener.acceptor" in loaded.stdout
