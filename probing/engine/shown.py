"""Stacks made ready to be shown: threads grouped, each with what it is doing (its state) and
each Python frame with its source line and its locals, all worked out here, so that the
renderer (cli/render/backtrace.py) only lays out what it is given.

Source lines are read where the rows are made, with the reader that fits where they came from:
the live process's own files (`SourceLines(pid)`), a record's or a core file's owner's
(engine/records, engine/kinds/core.py), nobody's for a PID that may be another process's now.
"""

from __future__ import annotations

import os

from ..analysis.asyncio_tasks import loop_tasks, runs_loop
from ..analysis.states import thread_state
from ..protocol.frames import json_loads

TYPE_CHECKING = False
if TYPE_CHECKING:  # on the way of `probing PID backtrace` (docs/decisions.md: start-up)
    from typing import Any, Dict, List, Optional, Tuple

    from ..analysis.asyncio_tasks import LoopTask
    from ..schema.rows import AsyncioTasksRow, BacktraceRow
    from .sources import SourceLines

# The tasks of one loop that `backtrace` shows (python.asyncio_tasks has up to 1 000), and the
# deepest a task is indented under the one that awaits it.
SHOWN_TASKS = 50
MAX_LEVEL = 8


class ShownFrame:
    """One frame as a traceback shows it. `code`: its source line ("" when none could be read);
    `locals`: (name, repr) pairs, empty unless asked for."""

    __slots__ = ("native", "func", "file", "lineno", "code", "locals")

    def __init__(
        self, native: bool, func: Any, file: Any, lineno: Any, code: str, locals: List[Tuple[Any, Any]]
    ) -> None:
        self.native = native
        self.func = func
        self.file = file
        self.lineno = lineno
        self.code = code
        self.locals = locals


class ShownTask:
    """One asyncio task of a thread's loop: its name, coroutine, state in words (with what it
    awaits), how deep under the tasks nobody awaits it is, and its frames outermost first."""

    __slots__ = ("name", "coroutine", "state", "level", "frames")

    def __init__(self, name: Any, coroutine: Any, state: str, level: int, frames: List[ShownFrame]) -> None:
        self.name = name
        self.coroutine = coroutine
        self.state = state
        self.level = level
        self.frames = frames


class ShownThread:
    """One thread: its native id (its Python ident when the OS's is unknown), name, whether it
    is the main thread, its state in words, and its frames outermost first. A thread running an
    asyncio loop has its `tasks` (at most SHOWN_TASKS), and `more_tasks`: what the rest do;
    `tasks_unread` when it was read from outside (only the agent reads a loop's tasks)."""

    __slots__ = (
        "native_id",
        "name",
        "is_main",
        "state",
        "frames",
        "tasks",
        "task_count",
        "more_tasks",
        "tasks_unread",
    )

    def __init__(self, native_id: Any, name: Any, is_main: Any, state: str, frames: List[ShownFrame]) -> None:
        self.native_id = native_id
        self.name = name
        self.is_main = is_main
        self.state = state
        self.frames = frames
        self.tasks: List[ShownTask] = []
        self.task_count = 0
        self.more_tasks = ""
        # A loop's thread read from outside: its tasks are the agent's alone to read.
        self.tasks_unread = False


def shown_threads(
    rows: List[BacktraceRow], sources: SourceLines, outside: Optional[Dict[Any, Dict[str, Any]]] = None,
    task_rows: Optional[List[AsyncioTasksRow]] = None,
) -> List[ShownThread]:  # fmt: skip
    """The threads of python.backtrace `rows` in the order they first appear, each with its
    loop's asyncio tasks (`task_rows`, python.asyncio_tasks). `outside`: py-spy's view of each
    thread (by native id), when the stacks were read from outside; it knows which thread holds
    the GIL."""
    loops = loop_tasks(task_rows or [])
    threads: Dict[Tuple[Any, Any], List[BacktraceRow]] = {}
    for row in rows:
        threads.setdefault((row["pid"], row["thread_id"]), []).append(row)
    shown = []
    for frames in threads.values():
        # A depth that is no number (a hostile agent's) sorts as the innermost, as a record's does.
        frames.sort(key=lambda row: row["depth"] if isinstance(row["depth"], int) else 0)
        first = frames[0]
        native_id = first["native_id"] if first["native_id"] is not None else first["thread_id"]
        state = thread_state(frames, lambda frame: _code(frame, sources), (outside or {}).get(native_id))
        outermost_first = [_frame(frame, sources) for frame in reversed(frames)]
        thread = ShownThread(native_id, first["thread_name"], first["is_main"], state, outermost_first)
        _add_tasks(thread, loops.get(first["thread_id"], []), sources)
        thread.tasks_unread = outside is not None and runs_loop(frames)
        shown.append(thread)
    return shown


def _add_tasks(thread: ShownThread, tasks: List[LoopTask], sources: SourceLines) -> None:
    thread.task_count = len(tasks)
    for task in tasks[:SHOWN_TASKS]:
        frames = [_task_frame(frame, sources) for frame in task.frames]
        level = min(task.level, MAX_LEVEL)
        thread.tasks.append(ShownTask(task.name, task.coroutine, _task_state(task), level, frames))
    rest = tasks[SHOWN_TASKS:]
    if rest:
        places: Dict[str, int] = {}
        for task in rest:
            place = f"{task.state} in {task.where()}"
            places[place] = places.get(place, 0) + 1
        common = sorted(places.items(), key=lambda item: -item[1])[:3]
        thread.more_tasks = ", ".join(f"{count} {place}" for place, count in common)
        if len(places) > 3:
            thread.more_tasks += ", ..."


def _task_state(task: LoopTask) -> str:
    if task.state == "waiting":
        return f"waiting for {task.awaits}"
    if task.state == "ready":
        return "ready to run"
    return str(task.state)


def _task_frame(row: AsyncioTasksRow, sources: SourceLines) -> ShownFrame:
    file = row["file"]
    code = sources.line(file, row["lineno"]) if isinstance(file, str) else ""
    return ShownFrame(False, row["func"], file, row["lineno"], code, [])


def _frame(row: BacktraceRow, sources: SourceLines) -> ShownFrame:
    if row["frame_type"] == "Native":
        return ShownFrame(True, row["func"], os.path.basename(str(row["file"])), row["lineno"], "", [])
    return ShownFrame(
        False, row["func"], row["file"], row["lineno"], _code(row, sources), _locals(row.get("locals"))
    )


def _code(row: BacktraceRow, sources: SourceLines) -> str:
    file = row["file"]
    return sources.line(file, row["lineno"]) if isinstance(file, str) else ""


def _locals(text: Any) -> List[Tuple[Any, Any]]:
    """The (name, repr) pairs of a frame's `locals` column; what does not parse is shown as is."""
    if not text:
        return []
    try:
        values = json_loads(str(text))
    except ValueError:
        return [("locals", text)]
    return list(values.items()) if isinstance(values, dict) else [("locals", text)]
