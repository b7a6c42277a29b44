"""Agents reached over TCP (`tcp://HOST:PORT`, `--endpoints`), on loopback: the commands work as
over the Unix socket once the token is proved, and every refusal is a clear error that runs
nothing in the job and never hangs."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from probing.engine.jobs.remote import JOIN_SLACK_S
from probing.engine.kinds.job import REGISTRY_TIMEOUT_S
from probing.errors import ExitCode

from support import (
    PROBING,
    TARGETS,
    VENV_PYTHON,
    Target,
    TorchrunJob,
    free_port,
    listener_of,
    listening_endpoint,
    probing,
    wait_until,
)  # fmt: skip

TOKEN = secrets.token_hex(16)
TOKEN_ENV = {"PROBING_TOKEN": TOKEN}


@pytest.fixture(scope="module")
def listening() -> Iterator[Target]:
    env = dict(TOKEN_ENV, PROBING_LISTEN="127.0.0.1:0")
    with Target("sleeper.py", via="env", env=env) as target:
        yield target


@pytest.fixture(scope="module")
def url(listening: Target) -> str:
    return f"tcp://{listening_endpoint(listening)}"


def test_backtrace_query_and_eval_over_tcp(listening: Target, url: str) -> None:
    result = probing(url, "backtrace", env=TOKEN_ENV)
    assert result.returncode == ExitCode.OK, result.stderr
    assert "in main_loop" in result.stdout or "main_loop()" in result.stdout
    result = probing(
        url, "query", "--format", "json", "SELECT DISTINCT pid FROM python.backtrace", env=TOKEN_ENV
    )
    assert result.returncode == ExitCode.OK, result.stderr
    assert json.loads(result.stdout) == [{"pid": listening.pid}]
    result = probing(url, "eval", "import os; os.getpid()", env=TOKEN_ENV)
    assert result.returncode == ExitCode.OK, result.stderr
    assert result.stdout.strip() == str(listening.pid)


def test_a_wrong_token_is_refused_and_runs_nothing(url: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').close()"
    result = probing(url, "eval", code, env={"PROBING_TOKEN": secrets.token_hex(16)})
    assert result.returncode == ExitCode.PERMISSION_DENIED, result.stderr
    assert f"the agent at {url} refused our token: PROBING_TOKEN differs from the job's" in result.stderr
    assert not marker.exists()


def without_token(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """probing with no PROBING_TOKEN and a token file that does not exist (never the user's own)."""
    environment = {key: value for key, value in os.environ.items() if key not in ("PROBING_TOKEN", "PROBING")}
    environment["PROBING_TOKEN_FILE"] = str(tmp_path / "no-token")
    return subprocess.run([PROBING, *args], capture_output=True, text=True, timeout=60, env=environment)


def test_no_token_on_the_cli_is_a_usage_error_with_the_hint(url: str, tmp_path: Path) -> None:
    result = without_token(tmp_path, url, "backtrace")
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert f"{url} needs the job's token" in result.stderr and "PROBING_TOKEN=$(python3" in result.stderr


def test_a_port_nobody_listens_on_is_a_clear_error_at_once() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    result = probing(f"tcp://127.0.0.1:{port}", "eval", "1", env=TOKEN_ENV)
    assert result.returncode == ExitCode.ERROR, result.stderr
    assert f"nothing listens on tcp://127.0.0.1:{port}" in result.stderr
    assert time.monotonic() - started < 5  # refused at once: the CLI's start-up, on a loaded machine


def test_a_peer_that_is_no_agent_is_a_bad_reply() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]

        def answer() -> None:
            peer, _ = server.accept()
            with peer:
                peer.sendall(b"HTTP/1.0 200 OK\r\n\r\nnot an agent, but long enough to read\r\n")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        result = probing(f"tcp://127.0.0.1:{port}", "eval", "1", env=TOKEN_ENV)
        thread.join(10)
    assert result.returncode == ExitCode.BAD_REPLY, result.stderr
    assert "not a probing agent" in result.stderr


def test_a_target_over_tcp_cannot_be_read_from_outside(url: str) -> None:
    result = probing(url, "backtrace", "--native", env=TOKEN_ENV)
    assert result.returncode == ExitCode.USAGE
    assert "reading from outside works only on the rank's own node" in result.stderr


def test_listen_starts_a_listener_in_a_running_agent() -> None:
    with Target("sleeper.py", via="env") as target:
        result = probing(str(target.pid), "listen", "--address", "127.0.0.1:0", env=TOKEN_ENV)
        assert result.returncode == ExitCode.OK, result.stderr
        assert f"PID {target.pid}: listens now on 127.0.0.1:" in result.stdout
        endpoint = listening_endpoint(target)
        assert endpoint in result.stdout
        again = probing(str(target.pid), "listen", env=TOKEN_ENV)
        assert again.returncode == ExitCode.OK and f"already listens on {endpoint}" in again.stdout
        result = probing(f"tcp://{endpoint}", "eval", "import os; os.getpid()", env=TOKEN_ENV)
        assert result.returncode == ExitCode.OK and result.stdout.strip() == str(target.pid)


def test_listen_without_a_token_refuses_before_asking(tmp_path: Path) -> None:
    with Target("sleeper.py", via="env") as target:
        result = without_token(tmp_path, str(target.pid), "listen")
        assert result.returncode == ExitCode.USAGE, result.stderr
        assert "listening on TCP needs a token" in result.stderr


@pytest.fixture(scope="module")
def listening_job() -> Iterator[TorchrunJob]:
    pytest.importorskip("torch")
    env = dict(TOKEN_ENV, PROBING="1", PROBING_LISTEN="127.0.0.1:0")
    with TorchrunJob("healthy", ranks=2, env=env) as job:
        yield job


def test_endpoints_reach_every_rank_of_a_torchrun_job(listening_job: TorchrunJob, tmp_path: Path) -> None:
    endpoints = {rank: listening_endpoint_of_pid(pid) for rank, pid in listening_job.pids.items()}
    given = ",".join(endpoints[rank] for rank in sorted(endpoints))
    sql = "SELECT DISTINCT rank, local_rank, node, pid FROM python.backtrace ORDER BY rank"
    result = probing("--endpoints", given, "query", "--ranks", "all", "--format", "json", sql, env=TOKEN_ENV)
    assert result.returncode == ExitCode.OK, result.stderr
    assert json.loads(result.stdout) == [
        {"rank": rank, "local_rank": rank, "node": 0, "pid": pid}
        for rank, pid in sorted(listening_job.pids.items())
    ]
    listed = tmp_path / "endpoints"
    listed.write_text("# the job's agents\n" + "\n".join(endpoints.values()) + "\n")
    result = probing("--endpoints", f"@{listed}", "ranks", "--format", "json", env=TOKEN_ENV)
    assert result.returncode == ExitCode.OK, result.stderr
    ranks = json.loads(result.stdout)["ranks"]
    assert [(rank["rank"], rank["pid"], rank["endpoint"]) for rank in ranks] == [
        (rank, listening_job.pids[rank], endpoints[rank]) for rank in sorted(endpoints)
    ]


def test_an_endpoint_that_does_not_answer_leaves_its_rank_missing(listening_job: TorchrunJob) -> None:
    """Rank 1's endpoint left out and a dead one given: rank 1 is missing (exit 14), the dead
    endpoint named, and rank 0 answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    given = f"{listening_endpoint_of_pid(listening_job.pids[0])},{dead}"
    started = time.monotonic()
    result = probing("--endpoints", given, "backtrace", "--ranks", "all", env=TOKEN_ENV)
    assert result.returncode == ExitCode.PARTIAL, result.stderr
    assert f"rank 0 (PID {listening_job.pids[0]} on " in result.stdout
    assert "rank 1 (PID ?)" in result.stderr and f"nothing listens on tcp://{dead}" in result.stderr
    assert time.monotonic() - started < 8  # nothing waited for: start-up, hellos, one backtrace


def test_ranks_shows_each_local_rank_endpoint(listening_job: TorchrunJob) -> None:
    result = probing(str(listening_job.agent_pid), "ranks", "--format", "json", env=TOKEN_ENV)
    assert result.returncode == ExitCode.OK, result.stderr
    ranks = json.loads(result.stdout)["ranks"]
    assert [rank["endpoint"] for rank in ranks] == [
        listening_endpoint_of_pid(listening_job.pids[rank]) for rank in sorted(listening_job.pids)
    ]


def listening_endpoint_of_pid(pid: int) -> str:
    endpoint = listener_of(pid)["endpoint"]
    assert isinstance(endpoint, str)
    return endpoint


def test_a_rank_that_stops_answering_leaves_a_partial_answer_in_time(listening_job: TorchrunJob) -> None:
    """Rank 1 stopped (SIGSTOP: its kernel still accepts connections, nothing answers): rank 0's
    rows come back and rank 1 is named missing, with its endpoint, within the timeouts: exit 14."""
    endpoints = [listening_endpoint_of_pid(listening_job.pids[rank]) for rank in (0, 1)]
    os.kill(listening_job.pids[1], signal.SIGSTOP)
    try:
        started = time.monotonic()
        sql = "SELECT DISTINCT rank FROM python.backtrace"
        result = probing(
            "--endpoints", ",".join(endpoints), "query", "--ranks", "all", "--timeout", "2",
            "--format", "json", sql, env=TOKEN_ENV,
        )  # fmt: skip
        elapsed = time.monotonic() - started
    finally:
        os.kill(listening_job.pids[1], signal.SIGCONT)
    assert result.returncode == ExitCode.PARTIAL, result.stderr
    assert json.loads(result.stdout) == [{"rank": 0}]
    assert "rank 1 (PID ?)" in result.stderr and f"tcp://{endpoints[1]}" in result.stderr
    # Its hello's 5 s (REGISTRY_TIMEOUT_S, one deadline for every endpoint) and rank 0's query,
    # with a few seconds for start-up on a loaded machine: not 5 s per endpoint, nor a hang.
    assert elapsed < REGISTRY_TIMEOUT_S + JOIN_SLACK_S + 5


def test_the_registry_read_by_a_local_agent_names_a_rank_of_another_node(
    listening_job: TorchrunJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job seen as if rank 1 ran on another node (left out of the local ranks): one local
    agent's `endpoints` answer makes rank 1 a remote rank with its registered endpoint, and the
    engine reaches it over TCP."""
    from probing.engine.backtrace import read_stacks
    from probing.engine.jobs.job import Job, find_job
    from probing.engine.jobs.remote import ask_registry, merge_registry
    from probing.engine.target import Target as EngineTarget

    found = find_job(listening_job.pids[0])
    here = Job(found.run_id, found.launcher, found.master, found.world_size, found.ranks[:1])
    deadline = time.monotonic() + 30
    while True:  # each rank registers once its job has imported torch.distributed
        registry, why = ask_registry(here, 5.0, lambda message: None)
        job = merge_registry(here, registry, why)
        if job.remote[0].unreachable is None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    (remote,) = job.remote
    assert remote.unreachable is None, remote.unreachable
    assert (remote.rank, remote.pid, remote.remote) == (1, listening_job.pids[1], True)
    assert remote.endpoint == listening_endpoint_of_pid(listening_job.pids[1])
    assert job.ranks[0].endpoint == listening_endpoint_of_pid(listening_job.pids[0])
    monkeypatch.setenv("PROBING_TOKEN", TOKEN)
    stacks = read_stacks(EngineTarget(f"tcp://{remote.endpoint}"), False, None, 5.0)
    assert stacks.info["pid"] == listening_job.pids[1]


def test_listen_on_every_local_rank_of_a_job_that_did_not_listen() -> None:
    pytest.importorskip("torch")
    with TorchrunJob("healthy", ranks=2, env=dict(TOKEN_ENV, PROBING="1")) as job:
        result = probing(
            str(job.agent_pid), "listen", "--ranks", "local", "--address", "127.0.0.1:0", "--format", "json",
            env=TOKEN_ENV,
        )  # fmt: skip
        assert result.returncode == ExitCode.OK, result.stderr
        ranks = json.loads(result.stdout)["ranks"]
        assert [(rank["rank"], rank["pid"]) for rank in ranks] == sorted(job.pids.items())
        for rank in ranks:
            assert rank["endpoint"] == listening_endpoint_of_pid(rank["pid"]) and not rank["already"]
        answer = probing(f"tcp://{ranks[1]['endpoint']}", "eval", "import os; os.getpid()", env=TOKEN_ENV)
        assert answer.returncode == ExitCode.OK and answer.stdout.strip() == str(job.pids[1])


def test_a_stale_registry_entry_leaves_its_rank_missing_not_another_answering(
    listening_job: TorchrunJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry names rank 1 at rank 0's endpoint (rank 1 gone, its port taken by another
    agent of the same user): what answers there says it is rank 0, so rank 1 is missing with
    that reason, and nothing is asked of rank 0 as if it were rank 1."""
    from probing.engine.backtrace import read_stacks
    from probing.engine.jobs.fanout import gather
    from probing.engine.jobs.job import Job, find_job
    from probing.engine.jobs.remote import merge_registry
    from probing.engine.target import Target as EngineTarget

    found = find_job(listening_job.pids[0])
    here = Job(found.run_id, found.launcher, found.master, found.world_size, found.ranks[:1])
    taken = listening_endpoint_of_pid(listening_job.pids[0])
    stale = {"rank": 1, "local_rank": 1, "group_rank": 0, "pid": listening_job.pids[1], "endpoint": taken}
    (remote,) = merge_registry(here, {"ranks": [stale]}).remote
    assert (remote.rank, remote.endpoint, remote.run_id, remote.world_size) == (1, taken, found.run_id, 2)
    monkeypatch.setenv("PROBING_TOKEN", TOKEN)
    gathered = gather(
        [remote],
        lambda rank: read_stacks(EngineTarget(f"tcp://{rank.endpoint}", rank=rank), False, None, 5.0),
        20.0,
    )
    [missing] = gathered.missing
    assert missing.error.message == (
        f"tcp://{taken} answered as rank 0 (PID {listening_job.pids[0]}), "
        f"not rank 1 (PID {listening_job.pids[1]}): a stale registry entry?"
    )


# A PID 1 whose main thread (thread 1) spins while it runs the command it is given.
SPINNING_PID_1 = """
import subprocess, sys, threading
done = {}
runner = threading.Thread(target=lambda: done.update(result=subprocess.run(sys.argv[1:], capture_output=True,
                                                                         text=True, timeout=120)))
runner.start()
while runner.is_alive():
    pass
sys.stdout.write(done["result"].stdout)
sys.stderr.write(done["result"].stderr)
sys.exit(done["result"].returncode)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="PID namespaces need root (unshare)")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare not found")
def test_hang_of_a_remote_target_never_reads_this_machine_proc(tmp_path: Path) -> None:
    """PIDs are per machine. A sleeper stuck reading stdin is PID 1 (main thread 1) of a PID
    namespace of its own, listening on loopback; the CLI runs in another PID namespace whose PID
    1 spins in its main thread 1. Read from this side's /proc, the remote thread would look busy
    and the process progressing; its agent's own counters (CPU, wake-ups) say it is hung (exit 11)."""
    port = free_port("127.0.0.1")
    environment = dict(os.environ, PYTHONUNBUFFERED="1", PROBING="1", PROBING_LISTEN=f"127.0.0.1:{port}",
                       PROBING_SOCKET_DIR=str(tmp_path), **TOKEN_ENV)  # fmt: skip
    namespace = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    sleeper = subprocess.Popen([*namespace, VENV_PYTHON, str(TARGETS / "sleeper.py")], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment)  # fmt: skip
    try:
        assert sleeper.stdout is not None
        ready = sleeper.stdout.readline().decode().split()
        assert ready[:2] == ["ready", "1"], ready  # PID 1 of its namespace
        url = f"tcp://127.0.0.1:{port}"
        assert wait_until(lambda: probing(url, "eval", "1", env=TOKEN_ENV).returncode == 0, timeout=30)
        command = [PROBING, "-v", url, "hang", "--duration", "1", "--samples", "3", "--format", "json"]
        spinning = [*namespace, VENV_PYTHON, "-c", SPINNING_PID_1, *command]
        result = subprocess.run(spinning, capture_output=True, text=True, timeout=120,
                                env=dict(os.environ, **TOKEN_ENV))  # fmt: skip
    finally:
        sleeper.kill()
        sleeper.wait(10)
    assert result.returncode == ExitCode.HUNG, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["pid"] == 1 and report["hung"] is True, report
    main = next(thread for thread in report["threads"] if thread["is_main"])
    assert (main["native_id"], main["activity"]) == (1, "still"), main
    # The agent's readings, on its own node (agent/watch.py): this side's PID 1 spins and wakes.
    assert main["cpu_percent"] is not None and main["cpu_percent"] < 5, main
    assert main["wakeups_per_s"] is not None and main["wakeups_per_s"] < 1, main
