"""`probing run`: the agent in every Python it starts, signals forwarded, status passed on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from probing.errors import ExitCode

from support import PROBING, Target, find_interpreter, interpreter_params, probing, wait_until


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
