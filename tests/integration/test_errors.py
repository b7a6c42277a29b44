"""Every failure against a real process: a clear message, its documented exit code, and the
target left running unharmed."""

from __future__ import annotations

import subprocess
import sys
import time

from probing.errors import ExitCode

from support import PROBING, VENV_PYTHON, Target, probing, wait_until


def test_no_such_process() -> None:
    result = probing("999999999", "backtrace")
    assert result.returncode == ExitCode.NO_SUCH_PROCESS
    assert result.stderr == (
        "probing: error: no process with PID 999999999\n  hint: check the PID with `probing list`\n"
    )


def test_not_a_python_process() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        result = probing(str(sleeper.pid), "backtrace")
        assert result.returncode == ExitCode.NOT_PYTHON
        assert result.stderr == f"probing: error: PID {sleeper.pid} is not a Python process\n"
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_python_process_without_an_agent_and_no_attach() -> None:
    job = subprocess.Popen([VENV_PYTHON, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert job.stdout is not None and job.stdout.readline() == b"ready\n"
        for command in (["eval", "1"], ["query", "SELECT 1"], ["tables"]):
            result = probing(str(job.pid), "--no-attach", *command)
            assert result.returncode == ExitCode.NO_AGENT
            assert (
                f"PID {job.pid} (Python {sys.version_info[0]}.{sys.version_info[1]}) has no probing agent"
                in result.stderr
            )
            assert "drop --no-attach to attach to it" in result.stderr
        assert job.poll() is None
    finally:
        job.kill()
        job.wait()


def test_an_agent_that_cannot_answer_times_out_cleanly() -> None:
    with Target("gil_holder.py") as job:
        started = time.monotonic()
        # backtrace would answer from outside (tests/integration/test_fallback.py); tables needs the agent.
        result = probing(str(job.pid), "tables", "--timeout", "1")
        assert time.monotonic() - started < 4
        assert result.returncode == ExitCode.AGENT_TIMEOUT
        assert "did not answer" in result.stderr and "hint:" in result.stderr
        assert job.alive()


def test_a_socket_path_target_and_a_bad_target() -> None:
    with Target("sleeper.py") as job:
        import os

        path = os.path.join(os.environ["PROBING_SOCKET_DIR"], f"{job.pid}.sock")
        assert probing(path, "backtrace").returncode == 0
        assert probing("-t", path, "query", "SELECT count(*) FROM python.threads").returncode == 0
    result = probing("/etc/passwd", "backtrace")
    assert result.returncode == ExitCode.USAGE and "TARGET must be a PID" in result.stderr


def test_a_stale_socket_means_no_agent(tmp_path: object) -> None:
    import os
    import socket

    path = os.path.join(str(tmp_path), "gone.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.close()  # the file stays, nobody listens: an agent killed with SIGKILL
    result = probing(path, "backtrace")
    assert result.returncode == ExitCode.NO_AGENT and "nothing listens on" in result.stderr


def test_list_shows_python_processes_and_their_agents() -> None:
    import json

    with Target("sleeper.py") as job:
        plain = subprocess.Popen([VENV_PYTHON, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        # A Python process that has exited, its parent (this test) not having reaped it yet.
        ended = subprocess.Popen([VENV_PYTHON, "-c", "pass"])
        assert wait_until(lambda: open(f"/proc/{ended.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z")
        try:
            listed = {row["pid"]: row for row in json.loads(probing("list", "--format", "json").stdout)}
            assert listed[job.pid]["agent"] is True and listed[job.pid]["command"].endswith("sleeper.py")
            assert listed[job.pid]["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
            assert listed[plain.pid]["agent"] is False
            assert ended.pid not in listed  # nothing to debug in a zombie
            table = probing("list").stdout.splitlines()
            assert table[0].split() == "pid user python agent job rank local_rank command".split()
        finally:
            plain.kill()
            plain.wait()
            ended.wait()


def test_a_reader_that_stops_early_is_not_an_error(sleeper: Target) -> None:
    """`probing PID query ... | head -1` exits 0 without a word, like the commands it sits among."""
    for command in ("query 'SELECT * FROM range(200000)'", "backtrace --format jsonl", "backtrace"):
        script = f"{PROBING} {sleeper.pid} {command} | head -c 1 >/dev/null; echo ${{PIPESTATUS[0]}}"
        result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
        assert (result.stdout, result.stderr) == ("0\n", ""), command
