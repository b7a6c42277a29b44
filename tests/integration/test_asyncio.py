"""asyncio jobs on every interpreter (3.8-3.15): `backtrace` shows the tasks of the loop under the
thread that runs it, python.asyncio_tasks lists them with their await chains, and `hang` judges
the job by its tasks. The target is tests/targets/asyncio_job.py."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any, Dict, List, Tuple

import pytest

from support import Target, interpreter_params, probing


def task_rows(pid: int, where: str = "") -> List[Dict[str, Any]]:
    sql = f"SELECT * FROM python.asyncio_tasks {where}"
    result = probing(str(pid), "query", sql, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def python_version(python: str) -> Tuple[int, ...]:
    text = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    )
    return tuple(int(part) for part in re.findall(r"\d+", text.stdout))


@pytest.mark.parametrize("python", interpreter_params())
def test_backtrace_shows_each_task_of_the_loop_with_its_await_chain(python: str) -> None:
    """Nested tasks (a gather inside a gather's child), a TaskGroup (3.11+), a task stuck on an
    Event: each under the loop's thread, indented under the task that awaits it, with its frames
    down to the line it awaits at."""
    group = python_version(python) >= (3, 11)
    with Target("asyncio_job.py", python=python) as job:
        result = probing(str(job.pid), "backtrace")
        assert result.returncode == 0, result.stderr
        text = result.stdout
        tasks = 8 if group else 5
        assert f"  asyncio tasks of its event loop: {tasks}\n" in text, text
        # The task stuck on the Event: its own frame, then Event.wait's, down to `await fut`.
        stuck = re.search(
            r'\n    Task "stuck-on-event" \(stuck_on_event\): waiting for Future\n'
            r'      File ".*asyncio_job.py", line 11, in stuck_on_event\n'
            r"        await event.wait\(\)\n"
            r'      File ".*asyncio/locks.py", line \d+, in wait\n'
            r"        await fut\n",
            text,
        )
        assert stuck, text
        # The gather inside a gathered task: its two leaves one level further in.
        assert '\n    Task "Task-3" (middle): waiting for gather of 2\n' in text or re.search(
            r'\n    Task "Task-\d+" \(middle\): waiting for gather of 2\n', text
        ), text
        assert len(re.findall(r'\n      Task "Task-\d+" \(leaf\): waiting for Future\n', text)) == 2, text
        if group:
            owner = re.search(r'\n    Task "Task-\d+" \(with_group\): waiting for Future\n', text)
            assert owner and re.search(r"in (__aexit__|_aexit)\n", text[owner.end() :]), text
            for member in ("group-member-1", "group-member-2"):
                assert f'\n      Task "{member}" (group_member): waiting for Future\n' in text, text
        # The main thread's own frames stay as they were: the loop in select.
        assert "in run_forever\n" in text and "asyncio tasks" in text.split("in select\n", 1)[1]

        rows = task_rows(job.pid, "WHERE depth = 0")
        by_name = {row["task_name"]: row for row in rows}
        assert len(rows) == tasks and by_name["stuck-on-event"]["func"] == "wait", rows
        main = next(row for row in rows if row["coroutine"] == "main")
        assert main["awaited_by"] is None and main["awaits"] == f"gather of {3 if group else 2}"
        assert by_name["stuck-on-event"]["awaited_by"] == main["task_id"], rows
        if group:
            owner_row = next(row for row in rows if row["coroutine"] == "with_group")
            assert by_name["group-member-1"]["awaited_by"] == owner_row["task_id"], rows
        assert {row["state"] for row in rows} == {"waiting"}
        assert {row["thread_id"] for row in rows} == {main["thread_id"]} and main["thread_id"]
        assert job.alive()


@pytest.mark.parametrize("python", interpreter_params())
def test_hang_names_the_stuck_task_and_where_it_awaits(python: str) -> None:
    with Target("asyncio_job.py", python=python) as job:
        result = probing(str(job.pid), "hang", "--duration", "1", "--samples", "3", "--format", "json")
        report = json.loads(result.stdout)
        assert report["hung"], report
        assert (
            "the asyncio loop of 'MainThread' idled while every task awaited the same futures"
            in report["reason"]
        )
        assert re.search(r"task '[^']+' awaits Future in wait \(locks.py:\d+\)", report["reason"]), report


@pytest.mark.parametrize("python", interpreter_params())
def test_a_loop_whose_tasks_move_is_not_hung(python: str) -> None:
    """A task that wakes up every 50 ms while the others wait: the loop thread only ever shows
    in select, but its tasks move, so the job progresses."""
    with Target("asyncio_job.py", python=python, args=["--ticker"]) as job:
        result = probing(str(job.pid), "hang", "--duration", "1", "--samples", "4", "--format", "json")
        report = json.loads(result.stdout)
        assert not report["hung"], report
        assert report["threads"][0]["activity"] == "moved", report


@pytest.mark.parametrize("python", interpreter_params())
def test_ten_thousand_tasks_are_cut_with_a_note(python: str) -> None:
    """10 000 tasks: the table lists 1 000, parents first, and says how many more there were
    and where they wait; backtrace shows 50 and sums up the rest."""
    with Target("asyncio_job.py", python=python, args=["--many", "10000"]) as job:
        result = probing(str(job.pid), "backtrace")
        assert result.returncode == 0, result.stderr
        text = result.stdout
        assert len(text.splitlines()) < 600, len(text.splitlines())
        assert "  asyncio tasks of its event loop: 1000\n" in text, text[-2000:]
        assert re.search(r"\n  \.\.\. and 950 more tasks: \d+ waiting in wait \(locks.py:\d+\)", text), text[
            -800:
        ]
        note = re.search(
            r"python.asyncio_tasks: (\d+) pending tasks, the first 1000 listed; (\d+) more", result.stderr
        )
        assert note and int(note.group(1)) >= 10_004 and int(note.group(2)) == int(note.group(1)) - 1000, (
            result.stderr
        )
        assert "waiting in sleeper()" in result.stderr
        # The task the job named comes first among its siblings: it is never the one cut.
        assert 'Task "stuck-on-event"' in text
        counted = probing(
            str(job.pid), "query", "SELECT count(DISTINCT task_id) AS n FROM python.asyncio_tasks"
        )
        assert re.search(r"\b1000\b", counted.stdout), counted.stdout
        assert job.alive()
