"""The native front end's attach (native/front/attach.c): the first `probing PID backtrace` of a
process without an agent, answered without the Python CLI, byte for byte as it answers; a job
whose GIL is held before any attach read from outside at once; a wait that takes long handed
to the Python CLI, which never injects a second helper.

"Without the Python CLI" is proven by a prefix of the front end's own (bin/probing, and the
installed package under lib/pythonX.Y/site-packages) with no `probing-python` in it: a
fallback there fails (exit 1), so a success is the native answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import BIN, Target, agent_threads, python_cli, run_bytes, wait_until

PYTHON_CLI = BIN / "probing-python"
SITE = f"python{sys.version_info[0]}.{sys.version_info[1]}"
PACKAGE = BIN.parent / "lib" / SITE / "site-packages" / "probing"
HELD = "the agent will start when it is released; answered from outside the process (py-spy)"


def prefix(tmp_path: Path, with_python_cli: bool) -> str:
    """bin/probing (a copy of the front end) and the installed package where pip puts it."""
    (tmp_path / "bin").mkdir()
    site = tmp_path / "lib" / SITE / "site-packages"
    site.mkdir(parents=True)
    (site / "probing").symlink_to(PACKAGE)
    shutil.copy(BIN / "probing", tmp_path / "bin" / "probing")
    if with_python_cli:
        shutil.copy(PYTHON_CLI, tmp_path / "bin" / "probing-python")
    return str(tmp_path / "bin" / "probing")


def told_injected(pid: int) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """`probing -v PID backtrace` of the Python CLI itself, told PROBING_INJECTED=PID (the front
    end takes the variable out of any command it is given)."""
    return run_bytes([str(PYTHON_CLI), "-v", str(pid), "backtrace"], env={"PROBING_INJECTED": str(pid)})


def one_agent(pid: int) -> bool:
    """The agent's thread alone, once the helper's loader (named the same) has returned."""
    return agent_threads(pid).count("probing-agent") == 1


@pytest.fixture
def front_alone(tmp_path: Path) -> str:
    assert (PACKAGE / "_native" / "probing-inject").exists(), PACKAGE
    return prefix(tmp_path, with_python_cli=False)


def test_a_fresh_process_is_attached_and_answered_natively(front_alone: str) -> None:
    with Target("sleeper.py", via="plain") as job:
        native = run_bytes([front_alone, str(job.pid), "backtrace"])
        assert native.returncode == 0, native.stderr.decode(errors="replace")
        assert wait_until(lambda: one_agent(job.pid), 10), agent_threads(job.pid)
        python = python_cli(job.pid)
        assert native.stdout == python.stdout and native.stderr == python.stderr == b""
        assert job.alive()


def test_a_job_holding_the_gil_before_any_attach_is_read_from_outside_at_once(front_alone: str) -> None:
    """py-spy from PATH (none beside this copy); the same answer and note as the Python CLI's,
    the helper's thread (waiting for the GIL) left out."""
    with Target("gil_holder.py", via="plain") as job:
        path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
        native = run_bytes([front_alone, str(job.pid), "backtrace"], env={"PATH": path})
        assert native.returncode == 0, native.stderr.decode(errors="replace")
        assert HELD in native.stderr.decode(), native.stderr
        assert "probing-attach" in agent_threads(job.pid)  # it starts the agent once the GIL is free
        python = python_cli(job.pid)
        assert (native.stdout, native.stderr) == (python.stdout, python.stderr)
        assert native.stdout.count(b"\nThread ") == 2, native.stdout  # the job's two, not the helper's
        assert job.alive()


def test_a_process_it_cannot_attach_alone_goes_to_the_python_cli(tmp_path: Path) -> None:
    """No package of its own version beside the front end: nothing injected, the Python CLI's."""
    (tmp_path / "bin").mkdir()
    front = tmp_path / "bin" / "probing"
    shutil.copy(BIN / "probing", front)
    with Target("sleeper.py", via="plain") as job:
        alone = run_bytes([str(front), str(job.pid), "backtrace"])
        assert alone.returncode == 1 and b"cannot run the Python CLI" in alone.stderr
        assert agent_threads(job.pid) == []


def test_a_slow_load_is_handed_over_and_the_helper_injected_once(tmp_path: Path) -> None:
    """A job collecting garbage in a loop slows the agent's load past the front end's wait: the
    Python CLI waits on for the same helper. One agent, whichever of the two saw it up."""
    front = prefix(tmp_path, with_python_cli=True)
    with Target("gc_loop.py", via="plain") as job:
        result = run_bytes([front, str(job.pid), "backtrace"])
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        assert b'"collector"' in result.stdout
        assert wait_until(lambda: one_agent(job.pid), 10), agent_threads(job.pid)
        assert "probing-attach" not in agent_threads(job.pid)


def test_the_python_cli_told_the_helper_is_in_does_not_inject_again() -> None:
    with Target("gil_holder.py", via="plain") as job:
        injector = PACKAGE / "_native" / "probing-inject"
        helper = PACKAGE / "_native" / "libprobing-helper.so"
        injected = run_bytes([str(injector), str(job.pid), str(helper)])
        assert injected.returncode == 0 and injected.stdout.startswith(b'{"ok": true'), injected
        told = told_injected(job.pid)
        log = told.stderr.decode()
        assert told.returncode == 0, log
        assert f"the native front end injected the helper into PID {job.pid}" in log
        assert "attaching to PID" not in log and HELD in log
        assert agent_threads(job.pid).count("probing-attach") == 1, agent_threads(job.pid)


def test_a_stray_injected_variable_does_not_stop_an_attach() -> None:
    """PROBING_INJECTED naming a process with no helper in it (exported by hand, or left over):
    the Python CLI attaches as usual."""
    with Target("sleeper.py", via="plain") as job:
        told = told_injected(job.pid)
        assert told.returncode == 0, told.stderr
        assert f"attaching to PID {job.pid}" in told.stderr.decode()
        assert "the native front end injected" not in told.stderr.decode()
