"""`hang` judges a thread that runs an asyncio loop by its tasks (analysis/progress.py with
analysis/asyncio_tasks.py), from fake Samples: no process."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from probing.analysis.asyncio_tasks import describe_stuck, loop_tasks, runs_loop
from probing.analysis.progress import Sample, verdict

PID = 100
THREAD = PID * 10
SELECT = [
    ("select", "/usr/lib/python3.12/selectors.py", 468),
    ("_run_once", "/usr/lib/python3.12/asyncio/base_events.py", 1949),
    ("run_forever", "/usr/lib/python3.12/asyncio/base_events.py", 641),
    ("<module>", "/job/serve.py", 40),
]
# (task_id, name, awaits, future_id, awaited_by, frames innermost first)
Task = Tuple[int, str, Optional[str], Optional[int], Optional[int], Sequence[Tuple[str, str, int]]]
WAIT = [("wait", "/usr/lib/python3.12/asyncio/locks.py", 212), ("consumer", "/job/serve.py", 12)]
MAIN = [("main", "/job/serve.py", 30)]


def stack_rows() -> List[Dict[str, Any]]:
    return [
        {
            "pid": PID, "thread_id": THREAD, "native_id": PID, "thread_name": "MainThread", "is_main": True,
            "depth": depth, "func": func, "file": file, "lineno": line, "frame_type": "Python",
            "locals": None, "source": "agent",
        }
        for depth, (func, file, line) in enumerate(SELECT)
    ]  # fmt: skip


def task_rows(tasks: Sequence[Task]) -> List[Dict[str, Any]]:
    rows = []
    for task_id, name, awaits, future_id, parent, frames in tasks:
        for depth, (func, file, line) in enumerate(frames):
            rows.append(
                {
                    "pid": PID, "thread_id": THREAD, "task_id": task_id, "task_name": name,
                    "state": "waiting" if awaits else "ready", "coroutine": frames[-1][0], "awaits": awaits,
                    "future_id": future_id, "awaited_by": parent, "depth": depth, "func": func,
                    "file": file, "lineno": line,
                }
            )  # fmt: skip
    return rows


def sample(taken: float, tasks: Sequence[Task], wakeups: int = 0) -> Sample:
    return Sample(taken, stack_rows(), {PID: (0, wakeups)}, None, task_rows(tasks))  # type: ignore[arg-type]


STUCK = [(1, "Task-1", "task 'consumer'", 11, None, MAIN), (2, "consumer", "Future", 22, 1, WAIT)]


def code_line(frame: Dict[str, Any]) -> str:
    return "fd_event_list = self._selector.poll(timeout, max_ev)" if frame["func"] == "select" else ""


def test_a_loop_whose_tasks_await_the_same_futures_is_hung_and_the_verdict_names_the_task() -> None:
    report = verdict(PID, [sample(0, STUCK), sample(5, STUCK), sample(10, STUCK)], code_line)
    assert report.hung
    assert "the asyncio loop of 'MainThread' idled while every task awaited the same futures" in report.reason
    # The task nobody waits for comes first: it is what the others are stuck behind.
    assert "task 'consumer' awaits Future in wait (locks.py:212)" in report.reason
    assert report.reason.index("'consumer'") < report.reason.index("'Task-1'")
    assert report.threads[0].stuck_tasks


def test_a_loop_whose_task_awaits_a_new_future_progresses_though_the_thread_never_left_select() -> None:
    """`while True: await asyncio.sleep(1)`: every sample in select, woken each second (looping,
    by the threads' rule), but the task awaits another future each time."""
    ticking = [
        [(1, "ticker", "Future", 100 + index, None, [("ticker", "/job/serve.py", 50)])] for index in range(3)
    ]
    samples = [sample(index * 5.0, tasks, wakeups=index * 5) for index, tasks in enumerate(ticking)]
    report = verdict(PID, samples, code_line)
    assert not report.hung and report.threads[0].activity == "moved", report.reason
    assert report.threads[0].stuck_tasks == ""


def test_a_task_that_ended_is_progress() -> None:
    report = verdict(PID, [sample(0, STUCK), sample(5, STUCK[:1])], code_line)
    assert not report.hung


def test_samples_without_tasks_keep_the_threads_rule() -> None:
    """py-spy's samples (read from outside) carry no tasks: the thread is judged as before."""
    plain = Sample(0, stack_rows(), {PID: (0, 0)}, None)  # type: ignore[arg-type]
    report = verdict(PID, [plain, plain._replace(taken=5.0)], code_line)
    assert report.hung and "asyncio" not in report.reason


def test_a_loop_thread_is_found_by_its_frames() -> None:
    assert runs_loop(stack_rows())  # type: ignore[arg-type]
    assert not runs_loop([dict(row, file="/job/base_events.py") for row in stack_rows()])  # type: ignore[misc]


def test_tasks_are_levelled_under_the_task_that_awaits_them() -> None:
    rows = task_rows(STUCK + [(3, "grandchild", "Future", 33, 2, WAIT)])
    tasks = loop_tasks(rows)[THREAD]  # type: ignore[arg-type]
    assert [(task.name, task.level) for task in tasks] == [("Task-1", 0), ("consumer", 1), ("grandchild", 2)]
    assert tasks[1].where() == f"wait ({os.path.basename(WAIT[0][1])}:212)"
    assert describe_stuck(tasks, shown=1).endswith("(and 2 more tasks)")
