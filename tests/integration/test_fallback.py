"""A backtrace that always answers: from outside with py-spy when the agent cannot, native
frames, descendants, and what each thread is doing."""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List

import pytest

from support import INTERPRETER_PATTERNS, Target, find_interpreter, probing, wait_until


def rows_of(result: Any) -> List[Dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    rows: List[Dict[str, Any]] = json.loads(result.stdout)
    return rows


@pytest.mark.parametrize("via", ["run", "plain"])
def test_a_thread_holding_the_gil_forever_still_gets_an_answer(via: str) -> None:
    """The agent is there but cannot run (or cannot come up): answered from outside, quickly."""
    with Target("gil_holder.py", via=via) as job:
        started = time.monotonic()
        result = probing(str(job.pid), "backtrace", "--format", "json")
        elapsed = time.monotonic() - started
        rows = rows_of(result)
        assert elapsed < 3 + 2, elapsed  # the budget, plus 2 s
        assert elapsed < 2.5  # decided early: a look from outside showed the GIL held
        assert "thread 'gil-holder' holds the GIL in hold_the_gil_forever (gil_holder.py:" in result.stderr
        assert "answered from outside the process (py-spy)" in result.stderr
        assert {row["source"] for row in rows} == {"py-spy"}
        holder = [row for row in rows if row["thread_name"] == "gil-holder"]
        assert holder[0]["func"] == "hold_the_gil_forever" and holder[0]["depth"] == 0
        text = probing(str(job.pid), "backtrace").stdout
        assert '"gil-holder": holds the GIL' in text
        assert job.alive()


def test_no_attach_reads_from_outside() -> None:
    with Target("sleeper.py", via="plain") as job:
        result = probing(str(job.pid), "--no-attach", "backtrace", "--format", "json")
        rows = rows_of(result)
        assert "no agent; answered from outside the process (py-spy)" in result.stderr
        assert {row["thread_name"] for row in rows} == {"MainThread", "worker"}
        assert probing(str(job.pid), "--no-attach", "eval", "1").returncode != 0  # still no agent


def test_a_job_stuck_on_its_gil_before_any_attach_is_read_from_outside_once_it_is_seen_still() -> None:
    """The first command injects, then finds no thread running (the GIL held by a blocked
    thread): it looks from outside at once, rather than after a fixed wait for an agent that
    cannot start, and that look is kept for the answer."""
    with Target("gil_holder.py", via="plain") as job:
        result = probing("-v", str(job.pid), "backtrace")
        assert result.returncode == 0, result.stderr
        lines = result.stderr.splitlines()
        injected = next(i for i, line in enumerate(lines) if "stopped for" in line)
        still = next(i for i, line in enumerate(lines) if "the agent is not up and no thread of PID" in line)
        assert injected < still
        assert "thread 'gil-holder' holds the GIL in hold_the_gil_forever" in result.stderr
        assert "the agent will start when it is released; answered from outside" in result.stderr
        assert '"gil-holder": holds the GIL' in result.stdout
        assert job.alive()


def test_native_frames_are_merged_with_their_library_names() -> None:
    with Target("c_sleeper.py", via="plain") as job:
        rows = rows_of(probing(str(job.pid), "backtrace", "--native", "--format", "json"))
        native = [row for row in rows if row["frame_type"] == "Native"]
        python = [row for row in rows if row["frame_type"] == "Python"]
        assert native and python
        assert any(str(row["file"]).endswith("libc.so.6") for row in native)
        assert rows[0]["frame_type"] == "Native"  # innermost: inside libc's sleep
        assert any(row["func"] == "<module>" for row in python)
        text = probing(str(job.pid), "backtrace", "--native").stdout
        assert '"MainThread", main thread: sleeping' in text and "[native] " in text


STRIPPED = find_interpreter(INTERPRETER_PATTERNS["debian-3.11"])
WITH_SYMBOLS = find_interpreter(INTERPRETER_PATTERNS["3.11"])


@pytest.mark.skipif(STRIPPED is None, reason="no stripped interpreter: Debian's /usr/bin/python3.11")
@pytest.mark.skipif(WITH_SYMBOLS is None, reason="no pyenv 3.11 (an interpreter with its symbols)")
def test_native_frames_of_a_stripped_interpreter_say_why_none_of_cpython_is_named() -> None:
    """Debian's python3.11 is stripped: py-spy names none of CPython's own frames (thread_run,
    lock_PyThread_acquire_lock), and the output says so instead of leaving them to be guessed.
    pyenv's 3.11 names them, and gets no such note."""
    assert STRIPPED is not None and WITH_SYMBOLS is not None
    with Target("sleeper.py", python=STRIPPED, via="plain") as job:
        result = probing("--no-attach", str(job.pid), "backtrace", "--native")
        assert result.returncode == 0, result.stderr
        assert (
            "/usr/bin/python3.11 is stripped (it has no symbol table): no frame of the CPython "
            in result.stderr
        )
        assert "(py-spy --native shows the same)" in result.stderr
        assert "thread_run" not in result.stdout and "[native] " in result.stdout
    with Target("sleeper.py", python=WITH_SYMBOLS, via="plain") as job:
        result = probing("--no-attach", str(job.pid), "backtrace", "--native")
        assert result.returncode == 0, result.stderr
        assert "is stripped" not in result.stderr
        assert "[native] thread_run in libpython3.11" in result.stdout


def test_thread_states_at_a_glance() -> None:
    with Target("deadlock.py", via="plain") as job:
        text = probing(str(job.pid), "backtrace").stdout
        assert '"takes-first": blocked entering `with theirs:`' in text
        assert '"takes-second": blocked entering `with theirs:`' in text
        assert '"MainThread", main thread: waiting in Thread.join' in text


def test_children_show_the_dataloader_worker_that_holds_the_batch() -> None:
    pytest.importorskip("torch")
    with Target("dataloader_stuck.py", via="plain") as job:
        import psutil

        assert wait_until(lambda: len(psutil.Process(job.pid).children()) >= 2, timeout=30)
        result = probing(str(job.pid), "backtrace", "--children", "--format", "json")
        rows = rows_of(result)
        workers = {row["pid"] for row in rows} - {job.pid}
        assert len(workers) >= 2
        stuck = [row for row in rows if row["func"] == "__getitem__"]
        assert stuck and stuck[0]["pid"] in workers and stuck[0]["source"] == "py-spy"
        text = probing(str(job.pid), "backtrace", "--children").stdout
        assert '"MainThread", main thread: waiting for a DataLoader worker' in text
        assert text.count("Process ") == 1 + len(workers)


def test_a_query_over_python_backtrace_takes_the_same_path() -> None:
    with Target("gil_holder.py") as job:
        started = time.monotonic()
        result = probing(
            str(job.pid),
            "query",
            "--format",
            "json",
            "SELECT func, source FROM python.backtrace WHERE depth = 0",
        )
        assert time.monotonic() - started < 3 + 2
        rows = rows_of(result)
        assert {"func": "hold_the_gil_forever", "source": "py-spy"} in rows
        assert "python.backtrace read from outside the process (py-spy)" in result.stderr
        other = probing(str(job.pid), "query", "--timeout", "1", "SELECT * FROM python.threads")
        assert other.returncode == 7 and "only queries over python.backtrace" in other.stderr


def test_a_job_stuck_on_its_gil_is_read_from_outside_without_waiting_out_the_early_look() -> None:
    """No thread of the process runs while its agent is silent: the GIL's holder is blocked, so
    the look from outside comes at once, not after EARLY_LOOK_S; a connection queue the stuck
    agent cannot drain is given up as soon too (each earlier probe left a connection in it)."""
    with Target("gil_holder.py") as job:
        for _ in range(12):  # more than the agent's listen backlog
            result = probing("-v", str(job.pid), "backtrace")
            assert result.returncode == 0, result.stderr
            assert f"no thread of PID {job.pid} runs" in result.stderr
            assert '"gil-holder": holds the GIL' in result.stdout
        assert job.alive()


def test_a_busy_job_is_never_taken_for_stuck() -> None:
    """A thread running Python keeps the process from looking still. (On a loaded machine its
    agent may still be late past EARLY_LOOK_S, and be read from outside for that reason.)"""
    with Target("busy.py") as job:
        for _ in range(5):
            result = probing("-v", str(job.pid), "backtrace", "--format", "json")
            assert result.returncode == 0, result.stderr
            assert "runs: looking from outside" not in result.stderr
