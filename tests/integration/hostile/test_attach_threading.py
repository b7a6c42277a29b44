"""Attaching must leave `threading` as the job would have had it (issue 11, item 3).

On Pythons that do not import `threading` at start-up (3.8-3.10, 3.12, 3.13, Debian's
3.11), the attach helper's thread is the first to import it. Before the fix, threading took
that thread for the main thread: the job's real main thread became a `_DummyThread`, and at
exit a non-daemon thread the job started was never joined (its file never written).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from support import Target, interpreter_params, probing


@pytest.fixture(params=interpreter_params())
def python(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


def test_a_job_that_imports_threading_after_the_attach_keeps_its_main_thread_and_joins_its_threads(
    python: str, tmp_path: Path
) -> None:
    written = tmp_path / "written"
    with Target("no_threading.py", python=python, via="plain") as job:
        backtrace = probing(str(job.pid), "backtrace", "--format", "json")
        assert backtrace.returncode == 0, backtrace.stderr
        main = [row for row in json.loads(backtrace.stdout) if row["depth"] == 0 and row["is_main"]]
        assert [(row["thread_name"], row["native_id"], row["func"]) for row in main] == [
            ("MainThread", job.pid, "<module>")
        ]
        dummies = probing(
            str(job.pid), "eval", "import threading\n[t.name for t in threading.enumerate() "
            "if isinstance(t, threading._DummyThread)]",
        )  # fmt: skip
        assert dummies.stdout == "[]\n", dummies.stderr

        assert job.process.stdin is not None
        job.process.stdin.write(f"start {written}\n".encode())
        job.process.stdin.flush()
        assert job.finish() == 0, job.output()
        assert "main_thread_is_current True _MainThread MainThread True" in job.stdout_lines
        assert "Exception ignored" not in job.output()
    # Both non-daemon threads were joined at exit: the forked child's too.
    assert written.read_text() == "written by a non-daemon thread\n"
    # (A forked child's native_id is its parent's main thread's, with or without probing.)
    assert Path(f"{written}.child").read_text().startswith("True _MainThread MainThread ")
