"""`probing run`: the agent in every Python it starts, signals forwarded, status passed on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from probing.errors import ExitCode

from support import PROBING, TARGETS, Target, find_interpreter, interpreter_params, probing, wait_until


@pytest.mark.parametrize("status", [0, 3, 42])
def test_the_commands_exit_status_is_passed_on(status: int) -> None:
    result = probing("run", "--", sys.executable, "-c", f"import sys; sys.exit({status})")
    assert result.returncode == status
    assert result.stderr.startswith("probing: started PID ")


def test_death_by_signal_is_128_plus_the_signal() -> None:
    result = probing(
        "run", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    )
    assert result.returncode == 128 + signal.SIGKILL


def test_a_missing_command_is_127() -> None:
    result = probing("run", "--", "/nonexistent/python", "train.py")
    assert result.returncode == ExitCode.COMMAND_NOT_FOUND == 127
    assert "probing: error: /nonexistent/python: command not found" in result.stderr


def test_sigterm_is_forwarded_to_the_job() -> None:
    with Target("exits.py", args=["wait"]) as job:
        job.process.send_signal(signal.SIGTERM)  # to `probing run`, not to the job
        assert job.process.wait(20) == 0
        assert wait_until(lambda: "got SIGTERM" in job.stdout_lines)


def test_sigint_without_a_terminal_is_forwarded() -> None:
    with Target("exits.py", args=["wait"]) as job:
        job.process.send_signal(signal.SIGINT)
        # The job dies of its KeyboardInterrupt, as it would from Ctrl-C.
        assert job.process.wait(20) in (1, 128 + signal.SIGINT)
        assert any("KeyboardInterrupt" in line for line in job.stderr_lines)


@pytest.mark.parametrize("python", interpreter_params())
def test_the_jobs_imports_are_untouched(python: str) -> None:
    """The agent comes from the CLI's install, yet nothing of probing is on the job's sys.path."""
    plain = subprocess.run([python, "-c", "import sys; print(sys.path)"], capture_output=True, text=True)
    with Target("sleeper.py", python=python) as job:
        result = probing(str(job.pid), "eval", "import sys; print(sys.path[1:])")
        assert result.returncode == 0, result.stderr
        # sys.path[0] is the script's directory in one case and '' for -c in the other.
        assert result.stdout.strip() == str(eval(plain.stdout)[1:])
        loaded = probing(
            str(job.pid),
            "eval",
            "sorted(m for m in __import__('sys').modules if 'click' in m or 'duckdb' in m)",
        )
        assert loaded.stdout == "[]\n"


def test_debians_own_sitecustomize_still_runs() -> None:
    python = find_interpreter("/usr/bin/python3.11")
    if python is None or not os.path.exists("/usr/lib/python3.11/sitecustomize.py"):
        pytest.skip("Debian's python3.11 with its sitecustomize is not installed")
    with Target("sleeper.py", python=python) as job:
        result = probing(str(job.pid), "eval", "import sys; sys.modules['sitecustomize'].__file__")
        assert result.stdout == "'/usr/lib/python3.11/sitecustomize.py'\n"


def test_run_needs_a_command() -> None:
    result = subprocess.run([PROBING, "run"], capture_output=True, text=True)
    assert result.returncode == ExitCode.USAGE


def test_a_report_that_cannot_be_written_is_refused_before_the_job_starts(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    job = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    result = probing("run", "--hang-timeout", "5", "--report", "/nonexistent/dir/hang.json", "--", *job)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "cannot write /nonexistent/dir/hang.json" in result.stderr
    assert not marker.exists()


def _watched(*options: str, job: List[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """`probing run --hang-timeout ... -- python tests/targets/supervisor.py ...`, to its end."""
    command = [PROBING, "run", *options, "--", sys.executable, str(TARGETS / "supervisor.py"), *job]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("main", ["sleep", "poll"])
def test_the_watchdog_lets_a_job_whose_main_thread_supervises_a_worker_finish(main: str) -> None:
    """The main thread loops on `time.sleep(1)` (or a 0.1 s poll) while a worker thread computes
    for 10 s: the job progresses all along, and ends by itself, with its own status (it was
    ended after 5 s, exit 11)."""
    started = time.monotonic()
    result = _watched("--hang-timeout", "5", job=["--main", main, "--worker", "compute", "--seconds", "10"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert time.monotonic() - started >= 10 and "made no progress" not in result.stderr


def test_the_watchdog_ends_a_supervised_job_whose_worker_is_stuck_and_names_the_threads(
    tmp_path: Path,
) -> None:
    report = tmp_path / "hang.json"
    result = _watched(
        "--hang-timeout", "3", "--report", str(report), job=["--main", "sleep", "--worker", "stuck"]
    )
    assert result.returncode == ExitCode.HUNG, result.stderr[-3000:]
    verdict = next(line for line in result.stderr.splitlines() if "made no progress" in line)
    assert (
        "(no thread that carries the process moved ('MainThread', 'worker'); the main thread only loops"
        in (verdict)
    )
    assert json.loads(report.read_text())["reason"].startswith(
        "no thread that carries the process moved ('MainThread', 'worker')"
    )


def test_the_watchdog_judges_the_threads_named_with_thread() -> None:
    """The main thread waits for good (`done.wait()`): alone it would decide, and the job would be
    ended; `--thread worker` says the worker carries it, and the job runs to its end."""
    job = ["--main", "wait", "--worker", "compute", "--seconds", "8"]
    result = _watched("--hang-timeout", "3", "--thread", "worker", job=job)
    assert result.returncode == 0, result.stderr[-3000:]


def test_thread_goes_with_hang_timeout() -> None:
    result = probing("run", "--thread", "worker", "--", sys.executable, "-c", "pass")
    assert result.returncode == ExitCode.USAGE and "--thread goes with --hang-timeout" in result.stderr
