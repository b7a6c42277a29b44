"""A job's Thread subclass may define `name`, `ident`, `daemon` or `is_alive` as its own code
(a property that takes a lock of the job's, logs, or raises). probing reads every thread from
threading's own fields: none of the job's code runs in the agent, and every command that names
threads still names this one (tests/targets/nosy_threads.py notes each property that ran)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import Target, interpreter_params, probing


@pytest.mark.parametrize("python", interpreter_params())
def test_no_property_of_the_jobs_thread_subclass_runs_in_the_agent(python: str, tmp_path: Path) -> None:
    with Target("nosy_threads.py", python=python, via="plain") as job:
        pid = str(job.pid)
        backtrace = probing(pid, "backtrace", "--timeout", "10")  # attaches: the helper looks at threads too
        assert backtrace.returncode == 0, backtrace.stderr
        assert '"nosy-worker": waiting' in backtrace.stdout and "in crunch" in backtrace.stdout, (
            backtrace.stdout
        )

        chosen = probing(pid, "backtrace", "--thread", "nosy-worker", "--format", "json")
        assert chosen.returncode == 0, chosen.stderr
        assert {row["thread_name"] for row in json.loads(chosen.stdout)} == {"nosy-worker"}

        threads = probing(pid, "query", "--format", "json",
                          "SELECT name, daemon, alive, native_id IS NOT NULL AS known FROM python.threads "
                          "WHERE NOT is_main")  # fmt: skip
        assert threads.returncode == 0, threads.stderr
        assert json.loads(threads.stdout) == [
            {"name": "nosy-worker", "daemon": True, "alive": True, "known": True}
        ]

        found = probing(pid, "eval", "batch_size")  # found in the worker's frame, named by its thread
        assert (found.returncode, found.stdout) == (0, "32\n"), found.stderr
        assert "nosy-worker" in found.stderr

        folded = tmp_path / "cpu.folded"
        flame = probing(pid, "flamegraph", "--duration", "1", "-o", str(folded))
        assert flame.returncode == 0, flame.stderr
        assert "nosy-worker" in folded.read_text()

        assert job.finish() == 0, job.output()
        assert "ran: []" in job.stdout_lines, job.output()
