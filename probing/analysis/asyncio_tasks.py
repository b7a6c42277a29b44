"""asyncio tasks read from python.asyncio_tasks rows: which thread runs a loop, each task's await
chain, and whether a loop's tasks moved between two reads. Pure functions over rows.

A thread runs an asyncio loop when one of its frames is BaseEventLoop.run_forever or _run_once
(the native front end hands such a backtrace to the Python CLI, which shows the tasks: it
reads this rule from here, native/front/gen_tables.py).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs `probing PID backtrace` start-up (docs/decisions.md)
    from typing import Any, Dict, Iterable, List, Set, Tuple

    from ..schema.rows import AsyncioTasksRow, BacktraceRow

# The frames of a thread that runs an asyncio event loop.
LOOP_FILE = "asyncio/base_events.py"
LOOP_FUNCTIONS = ("run_forever", "_run_once")


def runs_loop(rows: Iterable[BacktraceRow]) -> bool:
    """Whether any thread of these python.backtrace rows runs an asyncio event loop."""
    return any(
        row["func"] in LOOP_FUNCTIONS and isinstance(row["file"], str) and row["file"].endswith(LOOP_FILE)
        for row in rows
    )


class LoopTask:
    """One task: its id, name, state, coroutine, what it awaits, who awaits it, and its frames
    (rows) outermost first; `level`: how deep under the tasks nobody awaits it is."""

    __slots__ = (
        "task_id",
        "name",
        "state",
        "coroutine",
        "awaits",
        "future_id",
        "awaited_by",
        "frames",
        "level",
    )

    def __init__(self, first: AsyncioTasksRow) -> None:
        self.task_id = first["task_id"]
        self.name = first["task_name"]
        self.state = first["state"]
        self.coroutine = first["coroutine"]
        self.awaits = first["awaits"]
        self.future_id = first["future_id"]
        self.awaited_by = first["awaited_by"]
        self.frames: List[AsyncioTasksRow] = []
        self.level = 0

    def where(self) -> str:
        """Its innermost frame: "func (file:line)"."""
        if not self.frames:
            return f"{self.coroutine}()"
        frame = self.frames[-1]
        return f"{frame['func']} ({os.path.basename(str(frame['file']))}:{frame['lineno']})"


def loop_tasks(rows: Iterable[AsyncioTasksRow]) -> Dict[Any, List[LoopTask]]:
    """thread_id -> its loop's tasks in the order the agent listed them (parents before their
    children), each with its level under the tasks that nobody awaits."""
    by_thread: Dict[Any, Dict[Any, LoopTask]] = {}
    for row in rows:
        tasks = by_thread.setdefault(row["thread_id"], {})
        task = tasks.get(row["task_id"])
        if task is None:
            task = tasks[row["task_id"]] = LoopTask(row)
        if row["depth"] is not None:
            task.frames.append(row)
    result: Dict[Any, List[LoopTask]] = {}
    for thread_id, tasks in by_thread.items():
        for task in tasks.values():
            task.frames.sort(key=lambda frame: -(frame["depth"] if isinstance(frame["depth"], int) else 0))
            parent = tasks.get(task.awaited_by)
            # Parents come first: a level is known by the time its children are met.
            task.level = parent.level + 1 if parent is not None and parent is not task else 0
        result[thread_id] = list(tasks.values())
    return result


def task_signatures(rows: Iterable[AsyncioTasksRow]) -> Dict[Any, Set[Tuple[Any, ...]]]:
    """thread_id -> what its loop's tasks were doing: each task with the future it awaited and
    where. Two reads with equal signatures: no task of that loop moved in between."""
    signatures: Dict[Any, Set[Tuple[Any, ...]]] = {}
    for thread_id, tasks in loop_tasks(rows).items():
        signatures[thread_id] = {
            (task.task_id, task.state, task.future_id,
             tuple((frame["func"], frame["file"], frame["lineno"]) for frame in task.frames))
            for task in tasks
        }  # fmt: skip
    return signatures


def blocked_first(tasks: List[LoopTask]) -> List[LoopTask]:
    """The tasks a stuck loop is stuck on, most telling first: those no other task waits for
    (the leaves of the tree: they wait on an Event, a lock, I/O), then those that wait for them."""
    parents = {task.awaited_by for task in tasks}
    leaves = [task for task in tasks if task.task_id not in parents]
    return leaves + [task for task in tasks if task.task_id in parents]


def describe_stuck(tasks: List[LoopTask], shown: int = 3) -> str:
    """A stuck loop's tasks in words: "task 'a' awaits Future in wait (locks.py:213), ...", the
    first `shown` of them."""
    named = blocked_first(tasks)
    parts = [
        f"task {task.name!r} awaits {task.awaits or 'nothing'} in {task.where()}" for task in named[:shown]
    ]
    more = f" (and {len(named) - shown} more tasks)" if len(named) > shown else ""
    return ", ".join(parts) + more


def unplaced(rows: Iterable[AsyncioTasksRow], threads: Iterable[Any]) -> int:
    """How many tasks belong to no thread among `threads` (their loop is not running)."""
    known = set(threads)
    return len({row["task_id"] for row in rows if row["thread_id"] not in known})
