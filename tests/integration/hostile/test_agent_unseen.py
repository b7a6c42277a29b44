"""The job must not be able to tell it was looked at: the agent's threads are not threading's
(a job that waits for `threading.active_count()` to fall to 1 still exits), and a job that
replaces the modules the agent runs on (sockets, clocks, JSON, locks; gevent's patch_all) after
the attach neither breaks the agent (eval, backtrace, query, top) nor hears from it: no
exception of an agent thread reaches the job's hooks, its stderr or its exit status."""

from __future__ import annotations

import json
import time
from typing import Any, Dict

import pytest

from support import VENV_PYTHON, Target, interpreter_params, probing, wait_until

SEED_GUIDE_SNIPPET = (
    "import threading\nfor t in threading.enumerate():\n    print(t.name, t.daemon, t.is_alive())\n"
)


def _report(job: Target) -> Dict[str, Any]:
    """What the job's own threading says now (counts_threads.py's `report`)."""
    before = len(job.stdout_lines)
    assert job.process.stdin is not None
    job.process.stdin.write(b"report\n")
    job.process.stdin.flush()
    assert wait_until(lambda: any(line.startswith("{") for line in job.stdout_lines[before:])), job.output()
    line = next(line for line in job.stdout_lines[before:] if line.startswith("{"))
    return json.loads(line)  # type: ignore[no-any-return]


def _look_everywhere(pid: str) -> None:
    """The commands of a look at a job: each starts agent threads (connections, an eval's)."""
    for command in (["backtrace"], ["query", "SELECT count(*) FROM python.threads"], ["memory"]):
        done = probing(pid, *command, "--timeout", "20")
        assert done.returncode == 0, (command, done.stderr)
    # Code the agent runs that asks for current_thread() (logging does) leaves no _DummyThread.
    asks = "import logging, threading; logging.getLogger('job').debug('x'); threading.current_thread().name"
    logged = probing(pid, "eval", asks)
    assert logged.returncode == 0, logged.stderr


@pytest.mark.parametrize("python", interpreter_params())
def test_a_job_that_counts_its_threads_never_counts_the_agents(python: str) -> None:
    with Target("counts_threads.py", python=python, via="plain") as job:
        pid = str(job.pid)
        _look_everywhere(pid)

        seen = probing(pid, "eval", SEED_GUIDE_SNIPPET)
        assert seen.returncode == 0, seen.stderr
        assert sorted(line.split()[0] for line in seen.stdout.splitlines()) == ["MainThread", "worker"], (
            seen.stdout
        )
        threads = probing(pid, "query", "--format", "json", "SELECT name FROM python.threads ORDER BY name")
        assert threads.returncode == 0, threads.stderr
        assert [row["name"] for row in json.loads(threads.stdout)] == ["MainThread", "worker"]

        report = _report(job)
        assert report["active_count"] == 2 and report["names"] == ["MainThread", "worker"], report
        assert report["active_idents"] == 2 and report["limbo"] == 0 and report["dummies"] == [], report
        assert report["joined"] == ["MainThread", "worker"], report

        # Detach undoes the agent's hooks from one of its own threads: still nothing counted.
        assert probing(pid, "detach").returncode == 0
        report = _report(job)
        assert report["names"] == ["MainThread", "worker"] and report["dummies"] == [], report

        # The job's own idiom ends: nothing of probing's is counted, nothing waits for it.
        assert job.finish(timeout=30) == 0, job.output()
        assert "done" in job.stdout_lines, job.output()
        assert not any("HOOK" in line or "Exception" in line for line in job.stderr_lines), job.output()


def test_a_job_started_with_the_agent_counts_only_its_own_threads() -> None:
    """PROBING=1: the agent's threads start from the job's main thread, before its code runs."""
    with Target("counts_threads.py", via="env") as job:
        pid = str(job.pid)
        report = _report(job)
        assert report["active_count"] == 2 and report["dummies"] == [], report
        _look_everywhere(pid)
        report = _report(job)
        assert report["names"] == ["MainThread", "worker"] and report["dummies"] == [], report
        assert job.finish(timeout=30) == 0, job.output()
        assert not any("HOOK" in line or "Exception" in line for line in job.stderr_lines), job.output()


def _patch(job: Target, name: str) -> None:
    assert job.process.stdin is not None
    job.process.stdin.write(f"{name}\n".encode())
    job.process.stdin.flush()
    assert wait_until(lambda: f"patched {name}" in job.stdout_lines, timeout=30), job.output()


def _patch_params() -> list:  # type: ignore[type-arg]
    params = []
    for param in interpreter_params():
        params.append(pytest.param("socket", *param.values, id=f"socket-{param.id}", marks=param.marks))
        params.append(pytest.param("clocks", *param.values, id=f"clocks-{param.id}", marks=param.marks))
    # gevent is installed in the suite's own environment only.
    params.append(pytest.param("gevent", VENV_PYTHON, id="gevent"))
    return params


@pytest.mark.parametrize(("patch", "python"), _patch_params())
def test_a_job_that_patches_the_agents_modules_after_the_attach_is_neither_broken_nor_told(
    patch: str, python: str
) -> None:
    with Target("patches_modules.py", python=python, via="plain") as job:
        pid = str(job.pid)
        first = probing(pid, "backtrace")  # attaches: the agent's threads run from here on
        assert first.returncode == 0, first.stderr
        _patch(job, patch)

        for _ in range(3):  # new connections: the accept thread must survive each
            started = time.monotonic()
            answer = probing(pid, "eval", "6 * 7", "--timeout", "10")
            assert (answer.returncode, answer.stdout) == (0, "42\n"), answer.stderr
            assert time.monotonic() - started < 8, "an eval took as long as a timeout"
        backtrace = probing(pid, "backtrace", "--timeout", "10")
        assert backtrace.returncode == 0 and "MainThread" in backtrace.stdout, backtrace.stderr
        watched = probing(pid, "top", "--count", "2", "--interval", "0.3", "--timeout", "10")
        assert watched.returncode == 0 and watched.stdout.count("MainThread") == 2, watched.stderr
        query = probing(pid, "query", "--format", "json", "SELECT count(*) AS n FROM process.memory")
        assert query.returncode == 0 and json.loads(query.stdout)[0]["n"] >= 1, query.stderr
        # An eval that times out: waits, interrupts and their events run on the agent's own locks.
        late = probing(pid, "eval", "--timeout", "1", "while True: pass")
        assert late.returncode != 0 and "did not finish within 1 s" in late.stderr, late.stderr
        detached = probing(pid, "detach")
        assert detached.returncode == 0, detached.stderr

        assert job.finish(timeout=30) == 0, job.output()
        assert not any("HOOK" in line or "Exception in thread" in line for line in job.stderr_lines), (
            job.output()
        )


def test_a_thread_the_job_started_from_an_eval_is_the_jobs_when_read_from_outside() -> None:
    """A thread started by code an eval ran takes the eval thread's OS name (probing-eval-N)
    until it renames itself (3.14 does; 3.8-3.13 do not). Read from outside (the GIL held),
    threading's name decides, so it is still in the backtrace; the agent's own threads, which
    threading does not know, are left out by their OS names."""
    with Target("holds_gil_later.py") as job:
        pid = str(job.pid)
        started = probing(
            pid, "eval",
            "import threading, time\n"
            "threading.Thread(target=time.sleep, args=(3600,), name='started-in-eval', daemon=True).start()",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        assert job.process.stdin is not None
        job.process.stdin.write(b"hold\n")
        job.process.stdin.flush()
        assert wait_until(lambda: "holding" in job.stdout_lines, timeout=10), job.output()
        for fmt in ("text", "json"):
            shown = probing(pid, "backtrace", "--format", fmt, "--timeout", "5")
            assert shown.returncode == 0, shown.stderr
            assert "py-spy" in shown.stderr, shown.stderr  # read from outside
            assert "started-in-eval" in shown.stdout, shown.stdout
            assert "probing-" not in shown.stdout and "_accept_loop" not in shown.stdout, shown.stdout
