"""A live job whose agent stopped listening is told apart from one without an agent, read
from outside, and attached to again (issue 11, item 7).

The agent's listener dies while its process lives when code in the job closes the socket:
a job closing every descriptor above 2, or an eval. Before the fix, `backtrace` exited 6
("nothing listens ... left behind by a process that was killed?", with a hint to drop a
--no-attach nobody gave) instead of answering from outside, and `inject` waited for the
agent's own threads, which had inherited the attach helper's thread name, then blamed an
interpreter shutting down.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Iterator

import pytest

from probing.errors import ExitCode

from support import Target, agent_threads, interpreter_params, no_request_in_flight, probing, wait_until

FROM_OUTSIDE = "answered from outside the process (py-spy)"


@pytest.fixture(params=interpreter_params())
def python(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


def _listener_dies(job: Target) -> None:
    """After the socket is closed, a thread blocked in accept() still holds it (Linux keeps a
    socket open while a system call uses it) and takes one more connection; that connection
    is served, and then the listener is gone for good. So the first command may still get
    the old agent's answer; the second must not."""
    first = probing(str(job.pid), "backtrace")
    assert first.returncode == 0, first.stderr


def _answered_from_outside_then_attached_again(job: Target) -> None:
    pid = str(job.pid)
    fallback = probing(pid, "backtrace")
    assert fallback.returncode == 0, fallback.stderr
    assert f"the agent in PID {pid} stopped listening" in fallback.stderr
    assert FROM_OUTSIDE in fallback.stderr
    assert "MainThread" in fallback.stdout

    told = probing(pid, "--no-attach", "eval", "1")
    assert told.returncode == ExitCode.NO_AGENT
    assert f"the agent in PID {pid} stopped listening" in told.stderr
    assert "killed" not in told.stderr and "drop --no-attach" in told.stderr

    again = probing(pid, "eval", "1")
    assert (again.returncode, again.stdout) == (0, "1\n"), again.stderr
    rows = json.loads(probing(pid, "backtrace", "--format", "json").stdout)
    # From the new agent: no fallback, the main thread labelled, no agent thread (old or new).
    assert {(row["thread_name"], row["is_main"], row["source"]) for row in rows if row["depth"] == 0} == {
        ("MainThread", True, "agent"),
        ("worker", False, "agent"),
    }
    assert agent_threads(int(pid)).count("probing-memory") == 1, agent_threads(int(pid))  # one sampler, kept


def test_a_job_that_closes_its_descriptors_is_read_from_outside_and_attached_again(python: str) -> None:
    with Target("closes_fds.py", python=python, via="plain") as job:
        assert probing(str(job.pid), "eval", "1").stdout == "1\n"
        assert job.process.stdin is not None
        job.process.stdin.write(b"close\n")
        job.process.stdin.flush()
        assert wait_until(lambda: "closed" in job.stdout_lines, timeout=10)
        _listener_dies(job)
        _answered_from_outside_then_attached_again(job)
        assert job.finish() == 0, job.output()
        assert job.stderr_lines == []


def _tell(job: Target, line: str) -> None:
    assert job.process.stdin is not None
    job.process.stdin.write(line.encode() + b"\n")
    job.process.stdin.flush()


def test_descriptors_the_job_reused_after_closing_ours_are_never_touched_by_the_agent() -> None:
    """The job closes every descriptor and puts pipes on the agent's old numbers (its
    listener, a connection): attaching again, detaching and the old agent's threads ending
    must shut down or close none of them."""
    with Target("closes_fds.py", via="plain") as job:
        assert probing(str(job.pid), "eval", "1").stdout == "1\n"
        assert no_request_in_flight(job.pid)
        _tell(job, "close")
        assert wait_until(lambda: "closed" in job.stdout_lines, timeout=10)
        _tell(job, "reopen")
        assert wait_until(lambda: any(line.startswith("reopened") for line in job.stdout_lines), timeout=10)
        _listener_dies(job)  # the old accept() takes one more connection, then meets a pipe
        again = probing(str(job.pid), "eval", "1")
        assert (again.returncode, again.stdout) == (0, "1\n"), again.stderr
        assert probing(str(job.pid), "detach").returncode == 0
        _tell(job, "check")
        assert wait_until(lambda: any(line.startswith("pipes") for line in job.stdout_lines), timeout=10)
        assert "pipes ok" in job.stdout_lines, job.output()
        assert job.finish() == 0, job.output()
        assert job.stderr_lines == []


def test_an_eval_that_closes_the_listener_leaves_a_job_that_can_be_attached_again() -> None:
    with Target("closes_fds.py", via="plain") as job:
        closed = probing(
            str(job.pid), "eval", "import probing.agent as agent; agent._server.listener.close()"
        )
        assert closed.returncode == 0, closed.stderr
        _listener_dies(job)
        _answered_from_outside_then_attached_again(job)
        assert job.finish() == 0, job.output()


def test_a_socket_left_by_a_killed_process_is_no_agent_and_no_stopped_one() -> None:
    """The socket file of an earlier process with the same PID is older than the process:
    attaching goes ahead as for any process without an agent."""
    with Target("closes_fds.py", via="plain") as job:
        path = os.path.join(os.environ["PROBING_SOCKET_DIR"], f"{job.pid}.sock")  # tests/conftest.py
        with socket.socket(socket.AF_UNIX) as stale:
            stale.bind(path)
        started = os.stat(f"/proc/{job.pid}").st_mtime
        os.utime(path, (started - 3600, started - 3600))
        told = probing(str(job.pid), "--no-attach", "backtrace")
        assert told.returncode == 0 and "no agent; " + FROM_OUTSIDE in told.stderr
        assert probing(str(job.pid), "eval", "1").stdout == "1\n"
