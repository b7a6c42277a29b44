"""Signals and records (issue 15, review C): probing must leave a job's signals as they were.
SIGTERM/SIGHUP with the default action still kill at once (faulthandler dumps the stacks on the
way); a handler of the job's own still runs, at most SIGNAL_RECORD_WAIT_S late, whatever the
record meets."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_records_agent import only_record, record_env, send, table

from support import VENV_PYTHON, Target, interpreter_params, probing, wait_until


def test_sigterm_kills_a_job_blocked_in_c_at_once_and_leaves_its_stacks(tmp_path: Path) -> None:
    # A Python handler would run only when the main thread came back to bytecode: never, here.
    with Target("c_sleeper.py", via="env", env=record_env(tmp_path / "records")) as job:
        sent = time.monotonic()
        os.kill(job.pid, signal.SIGTERM)
        assert job.process.wait(30) == -signal.SIGTERM
        assert time.monotonic() - sent < 1.0
    (fatal,) = (tmp_path / "records").glob("*.fatal")
    assert 'c_sleeper.py", line' in fatal.read_text() and "in <module>" in fatal.read_text()
    listed = probing("records", "--dir", str(tmp_path / "records")).stdout
    assert "SIGTERM or SIGHUP (default action) ended the job" in listed, listed


def test_a_signal_while_the_main_thread_holds_a_ring_lock_reaches_the_jobs_handler(
    tmp_path: Path,
) -> None:
    # The record needs the lock the interrupted main thread holds: the job's handler runs after
    # SIGNAL_RECORD_WAIT_S, and the record is finished once the lock is free.
    note = tmp_path / "handler-ran"
    with Target(
        "signal_in_ring.py", via="env", args=[str(note)], env=record_env(tmp_path / "records")
    ) as job:
        assert job.process.wait(30) == 7
    assert note.read_text() == "job handler ran for 15\n"
    record = only_record(tmp_path / "records")
    assert "process.memory" in record.header["tables"]
    assert any("handler was called after 1 s" in note for note in record.header["notes"])
    assert all(row["locals"] is None for row in table(record, "python.backtrace"))


def test_a_signal_the_job_survives_is_recorded_once_a_minute(tmp_path: Path) -> None:
    with Target("reloads.py", via="env", env=record_env(tmp_path / "records")) as job:
        for count in (1, 2, 3):
            os.kill(job.pid, signal.SIGHUP)
            line = f"reloaded {count}"
            assert wait_until(lambda: line in job.stdout_lines, 30), job.output()  # noqa: B023
        assert job.finish() == 0
    assert only_record(tmp_path / "records").header["reason"]["signal"] == signal.SIGHUP


@pytest.mark.parametrize("python", interpreter_params())
def test_an_attached_agent_leaves_the_stacks_of_a_default_sigterm(tmp_path: Path, python: str) -> None:
    env = record_env(tmp_path / "records")
    with Target("c_sleeper.py", python=python, via="plain", env=env) as job:
        # Attached from the helper's thread, to a main thread that never runs bytecode again.
        probe = "import signal; print(signal.signal.__qualname__)"
        assert probing(str(job.pid), "eval", probe).stdout.strip() == "signal"  # not wrapped
        os.kill(job.pid, signal.SIGTERM)
        assert job.process.wait(30) == -signal.SIGTERM
    (fatal,) = (tmp_path / "records").glob("*.fatal")
    assert 'c_sleeper.py", line' in fatal.read_text()
    shown = probing(str(fatal), "backtrace")
    assert shown.returncode == 0 and 'c_sleeper.py", line' in shown.stdout, shown.stderr


# How tests/targets/dies.py is made to die of each signal (a command, or the signal sent to it),
# why `probing records` says it ended, and the job's function at the top of the thread it hit.
FATAL_ENDS = {
    "SIGSEGV": ("segv", "fatal_signal: Segmentation fault", "read_address"),
    "SIGABRT": ("abort", "fatal_signal: Aborted", "give_up"),
    "SIGTERM": (None, "SIGTERM or SIGHUP (default action) ended the job", "<module>"),
}


@pytest.mark.parametrize("end", list(FATAL_ENDS))
@pytest.mark.parametrize("python", interpreter_params())
def test_a_job_killed_by_a_fatal_signal_leaves_stacks_that_backtrace_and_records_read(
    tmp_path: Path, python: str, end: str
) -> None:
    """3.14's faulthandler names each thread (`Thread 0x... [probing-agent] (most ...`): the file
    must still read as the stacks, not as a job that "ended without a trace"."""
    directory = tmp_path / "records"
    command, why, function = FATAL_ENDS[end]
    with Target("dies.py", python=python, env=record_env(directory)) as job:
        if command is None:
            os.kill(job.pid, signal.SIGTERM)
        else:
            send(job, command)
        assert job.process.wait(30) == 128 + signal.Signals[end]  # probing run: 128 + N
    (fatal,) = directory.glob("*.fatal")
    shown = probing(str(fatal), "backtrace")
    assert shown.returncode == 0, shown.stderr
    assert 'dies.py", line' in shown.stdout and f", in {function}\n" in shown.stdout, shown.stdout
    assert "probing/agent" not in shown.stdout  # the agent's own threads are left out
    listed = probing("records", "--dir", str(directory)).stdout
    assert why in listed and "without a trace" not in listed, listed


def test_getsignal_answers_what_is_installed_once_a_handler_got_past_the_wrapper(tmp_path: Path) -> None:
    script = """
import _signal, faulthandler, signal
from probing.agent import records
records.install(None)
def mine(signum, frame): pass
_signal.signal(signal.SIGTERM, mine)  # past the wrapper: ours is gone, the job's runs alone
assert signal.getsignal(signal.SIGTERM) is mine
def later(signum, frame): pass
assert signal.signal(signal.SIGTERM, later) is mine  # a library chaining to the real one
records.uninstall()
assert signal.getsignal(signal.SIGTERM) is later
print("real")
"""
    environment = dict(os.environ, **record_env(tmp_path / "records"))
    result = subprocess.run([VENV_PYTHON, "-c", script], capture_output=True, text=True, env=environment)
    assert result.stdout == "real\n", result.stderr


def test_a_forked_child_killed_by_sigterm_writes_nothing_into_its_parents_fatal_file(tmp_path: Path) -> None:
    script = """
import os, signal, sys, time
import probing.agent.records as records
while records.current() is None:
    time.sleep(0.01)  # the agent starts in the main thread, before this runs; be sure anyway
child = os.fork()
if child == 0:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    os._exit(0)
_, status = os.waitpid(child, 0)
print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)
(name,) = os.listdir(sys.argv[1])
print(open(os.path.join(sys.argv[1], name)).read().count("most recent call first"))
"""
    directory = tmp_path / "records"
    environment = dict(os.environ, PROBING="1", **record_env(directory))
    result = subprocess.run(
        [VENV_PYTHON, "-c", script, str(directory)], capture_output=True, text=True, env=environment
    )
    assert result.stdout == "True\n0\n", result.stderr  # the child died of it, with no dump of ours
