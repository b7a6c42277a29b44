"""python.asyncio_tasks: every pending asyncio task of the process with its await chain, parents
before their children, bounded (MAX_TASKS listed, the rest counted by coroutine and state) and
paced (pacing.py). Where the tasks are found and how their fields are read without running the
job's code: asyncio_fields.py."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Set, Tuple

from .asyncio_fields import CHAIN_TYPES, MAX_DEPTH, Reader, all_tasks, chain, instance_dict, running
from .pacing import Pacer
from .stacks import current_frames

# The most tasks listed (parents before children); the others are counted by coroutine.
MAX_TASKS = 1000
# The most tasks looked at at all: beyond it they are only counted.
MAX_SCANNED = 200_000


class _Task:
    """What is read of one task: its name, state, what it waits for, its frames outermost first."""

    __slots__ = (
        "task",
        "name",
        "state",
        "waiter",
        "awaits",
        "thread_id",
        "coroutine",
        "frames",
        "cut",
        "parent",
    )

    def __init__(self, task: Any, name: str) -> None:
        self.task = task
        self.name = name
        self.state = "ready"
        self.waiter: Any = None
        self.awaits: Optional[str] = None
        self.thread_id: Optional[int] = None
        self.coroutine: Optional[str] = None
        self.frames: List[Any] = []
        self.cut = False
        self.parent: Optional[int] = None


def _describe_waiter(reader: Reader, waiter: Any) -> str:
    if reader.is_task(waiter):
        text = f"task {reader.name(waiter)!r}"
    elif reader.is_gather(waiter):
        text = f"gather of {len(reader.children(waiter))}"
    else:
        text = type(waiter).__name__
    return text if reader.pending(waiter) else f"{text} (done: the task runs next)"


def _thread_of(reader: Reader, task: Any, threads: Dict[int, Optional[int]]) -> Optional[int]:
    loop = reader.field(task, "_loop")
    if loop is None:
        return None
    if id(loop) not in threads:
        ident = instance_dict(loop).get("_thread_id")
        threads[id(loop)] = ident if type(ident) is int else None
    return threads[id(loop)]


def _read_task(reader: Reader, task: Any, threads: Dict[int, Optional[int]]) -> Optional[_Task]:
    """A pending task's fields (not its frames: only listed tasks need those); None once done."""
    if not reader.pending(task):
        return None
    found = _Task(task, reader.name(task))
    coro = reader.field(task, "_coro")
    code = (
        getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        if type(coro) in CHAIN_TYPES
        else None
    )
    found.coroutine = code.co_name if code is not None else type(coro).__name__
    waiter = reader.field(task, "_fut_waiter")
    found.thread_id = _thread_of(reader, task, threads)
    if running(coro):
        found.state = "running"
    elif waiter is not None and reader.is_future(waiter):
        found.waiter = waiter
        found.state = "waiting" if reader.pending(waiter) else "ready"
        found.awaits = _describe_waiter(reader, waiter)
    return found


def _link_parents(reader: Reader, read: Dict[int, _Task]) -> None:
    """Each task's parent: the task that awaits it (directly or through nested gathers), else the
    owner of its TaskGroup, else (3.14+) whoever asyncio recorded as awaiting it."""
    for parent in read.values():
        pending = [parent.waiter] if parent.waiter is not None else []
        seen = 0
        while pending and seen < MAX_DEPTH:
            future = pending.pop()
            seen += 1
            child = read.get(id(future))
            if child is not None and child is not parent and child.parent is None:
                child.parent = id(parent.task)
            pending.extend(reader.children(future))
    for child in read.values():
        if child.parent is not None:
            continue
        owner = reader.group_owner(child.task)
        if owner is None:
            waiters = reader.field(child.task, "_asyncio_awaited_by")
            owner = next(iter(list(waiters)), None) if type(waiters) in (set, frozenset) else None
        if owner is not None and id(owner) in read and owner is not child.task:
            child.parent = id(owner)


def _name_key(task: _Task) -> Tuple[bool, str, int, str]:
    """Tasks the job named first (a name is what it cares about), then Task-9 before Task-10:
    the name's text before its trailing number, then the number (about the order they began)."""
    name = task.name
    digits = len(name) - len(name.rstrip("0123456789"))
    number = int(name[-digits:]) if 0 < digits < 19 else -1
    prefix = name[: len(name) - digits] if digits else name
    return prefix == "Task-", prefix, number, name


def _tree_order(read: Dict[int, _Task]) -> List[_Task]:
    """Parents before their children, each level in name order; a cycle is broken anywhere."""
    children: Dict[Optional[int], List[_Task]] = {}
    for task in read.values():
        key = task.parent if task.parent in read else None
        children.setdefault(key, []).append(task)
    ordered: List[_Task] = []
    placed: Set[int] = set()
    pending = sorted(children.get(None, []), key=_name_key, reverse=True)
    leftovers = sorted(read.values(), key=_name_key, reverse=True)
    while pending or leftovers:
        task = pending.pop() if pending else leftovers.pop()
        if id(task.task) in placed:
            continue
        placed.add(id(task.task))
        ordered.append(task)
        pending.extend(sorted(children.get(id(task.task), []), key=_name_key, reverse=True))
    return ordered


def _cut_note(total: int, scanned: int, unlisted: List[_Task]) -> str:
    counts: Dict[Tuple[str, str], int] = {}
    for task in unlisted:
        key = (task.state, task.coroutine or "?")
        counts[key] = counts.get(key, 0) + 1
    common = sorted(counts.items(), key=lambda item: -item[1])[:3]
    shown = ", ".join(f"{count} {state} in {coroutine}()" for (state, coroutine), count in common)
    more = total - MAX_TASKS
    unread = f" ({total - scanned} not read at all)" if total > scanned else ""
    return (
        f"python.asyncio_tasks: {total} pending tasks, the first {MAX_TASKS} listed; {more} more "
        f"not listed{unread}: {shown}"
    )


def asyncio_task_rows(exclude: Any, pacer: Pacer) -> Tuple[List[Tuple[Any, ...]], List[str]]:
    """python.asyncio_tasks rows in column order, and notes of what was left out."""
    module = sys.modules.get("_asyncio")
    if module is None and "asyncio" not in sys.modules:
        return [], []
    reader = Reader(module)
    tasks = all_tasks(module, exclude)
    pacer.pause_if_due()
    threads: Dict[int, Optional[int]] = {}
    read: Dict[int, _Task] = {}
    for index, task in enumerate(tasks[:MAX_SCANNED]):
        if index % 64 == 0:
            pacer.pause_if_due()
        found = _read_task(reader, task, threads)
        if found is not None:
            read[id(task)] = found
    _link_parents(reader, read)
    pacer.pause_if_due()
    ordered = _tree_order(read)
    listed, unlisted = ordered[:MAX_TASKS], ordered[MAX_TASKS:]
    notes = []
    unread = len(tasks) - min(len(tasks), MAX_SCANNED)
    if unlisted or unread:
        notes.append(_cut_note(len(ordered) + unread, len(ordered), unlisted))
    rows, cut = _rows(listed, pacer, exclude, reader)
    if cut:
        notes.append(f"python.asyncio_tasks: the await chains of {cut} tasks were cut at {MAX_DEPTH} frames")
    return rows, notes


def _rows(
    listed: List[_Task], pacer: Pacer, exclude: Any, reader: Reader
) -> Tuple[List[Tuple[Any, ...]], int]:
    frames_now = current_frames()
    pid = os.getpid()
    rows: List[Tuple[Any, ...]] = []
    cut = 0
    for task in listed:
        pacer.pause_if_due()
        running = (
            frames_now.get(task.thread_id)
            if task.state == "running" and task.thread_id is not None and task.thread_id not in exclude
            else None
        )
        frames, was_cut = chain(reader.field(task.task, "_coro"), running)
        cut += was_cut
        head = (pid, task.thread_id, id(task.task), task.name, task.state, task.coroutine, task.awaits,
                id(task.waiter) if task.waiter is not None else None, task.parent)  # fmt: skip
        if not frames:
            rows.append(head + (None, None, None, None))
        for depth, frame in enumerate(reversed(frames)):
            code = frame.f_code
            rows.append(head + (depth, code.co_name, code.co_filename, frame.f_lineno))
    return rows, cut
