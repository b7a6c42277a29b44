"""The agent reads asyncio tasks from its own thread without running the job's code: a Task
subclass whose properties and methods would record a call, a loop in another thread, an async
generator and a running task (agent/asyncio_tasks.py, agent/asyncio_fields.py)."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any, Dict, List, Tuple

import pytest

from probing.agent.asyncio_tasks import asyncio_task_rows
from probing.agent.pacing import Pacer
from probing.schema.tables import ASYNCIO_TASKS

NAMES = ASYNCIO_TASKS.column_names()
calls: List[str] = []


class Watched(asyncio.Task):  # type: ignore[type-arg]
    """Every attribute a reader might ask for, answered by the job's own code."""

    def get_name(self) -> str:
        calls.append("get_name")
        return "not-this"

    def done(self) -> bool:
        calls.append("done")
        return super().done()

    @property  # type: ignore[misc]
    def _coro(self) -> Any:
        calls.append("_coro")
        return None

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("__"):
            calls.append(name)
        return super().__getattribute__(name)


async def ticks() -> Any:
    while True:
        await asyncio.sleep(3600)
        yield 1


def job(ready: threading.Event, stop: List[Any]) -> None:
    async def consumer(event: asyncio.Event) -> None:
        async for _ in ticks():
            await event.wait()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop.append((loop, asyncio.Event()))
        watched = Watched(consumer(asyncio.Event()), loop=loop)
        watched.set_name("watched")
        asyncio.ensure_future(consumer(asyncio.Event())).set_name("plain")
        for _ in range(3):
            await asyncio.sleep(0)
        ready.set()
        await stop[0][1].wait()
        watched.cancel()

    asyncio.run(main())


@pytest.fixture()
def loop_thread() -> Any:
    ready, stop = threading.Event(), []  # type: ignore[var-annotated]
    thread = threading.Thread(target=job, args=(ready, stop), name="loop")
    thread.start()
    assert ready.wait(10)
    yield thread
    loop, event = stop[0]
    loop.call_soon_threadsafe(event.set)
    thread.join(10)


def by_task(rows: List[Tuple[Any, ...]]) -> Dict[str, List[Dict[str, Any]]]:
    tasks: Dict[str, List[Dict[str, Any]]] = {}
    for values in rows:
        row = dict(zip(NAMES, values))
        tasks.setdefault(row["task_name"], []).append(row)
    return tasks


def test_tasks_are_read_without_calling_the_jobs_code(loop_thread: threading.Thread) -> None:
    calls.clear()
    rows, notes = asyncio_task_rows(set(), Pacer())
    tasks = by_task(rows)
    if sys.version_info < (3, 14):  # 3.14's all_tasks asks a subclass's done() (asyncio_fields.py)
        assert calls == [], calls
    assert notes == []
    assert "watched" in tasks and "not-this" not in tasks, tasks.keys()
    # Through the async generator's asend: the generator's own frame is in the chain.
    chain = [row["func"] for row in sorted(tasks["plain"], key=lambda row: -row["depth"])]
    assert chain == ["consumer", "ticks", "sleep"], chain
    assert {row["thread_id"] for each in tasks.values() for row in each} == {loop_thread.ident}
    # The main task's name is Task-N, N counted over the whole process (another test's loop may
    # have made tasks before): it is found by its coroutine.
    (main,) = [
        rows[0] for name, rows in tasks.items() if name.startswith("Task-") and rows[0]["coroutine"] == "main"
    ]
    assert main["coroutine"] == "main" and main["awaits"] == "Future" and main["state"] == "waiting"
