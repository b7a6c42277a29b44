"""`watch`: this process's stacks sampled over a window by the agent itself, with every thread's
CPU ticks and wake-ups read at each sample from this node's /proc (issue 28).

It is what `hang` asks of a rank it reaches over TCP: one request for the whole window, instead
of a backtrace and a python.threads table per sample, each a round trip (through the node's
relay, one batch per sample for every rank of the node). Each sample is exactly what those two
requests would have read: python.backtrace rows as a `backtrace` builds them, and the counters
the CLI reads for a local process (engine/hang.py take_sample), here read where the threads are.
Where asyncio is imported, each sample reads python.asyncio_tasks too, for the verdict on a loop.

The job pays what the per-sample requests cost it, less their connections: each sample is one
backtrace's work, and between samples the agent's thread sleeps (the GIL let go).
"""

from __future__ import annotations

import os
import sys

from ..originals import monotonic, sleep
from ..procfs import thread_cpu_ticks, thread_wakeups
from ..schema.tables import ASYNCIO_TASKS, BACKTRACE
from .columns import TableBuilder
from .pacing import Pacer
from .requests import ErrorKind, RequestError, float_param, int_param
from .stacks import backtrace_rows

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

# The most samples one watch takes (hang's default is 10).
MAX_SAMPLES = 100
# The longest window: what one request may keep a connection of the agent's.
MAX_DURATION_S = 600.0
NATIVE_ID = [name for name, _ in BACKTRACE.column_types()].index("native_id")
# Tables built once the window is over, into the same reply (hang's python.collectives and
# python.process_groups): at most this many.
MAX_TABLES = 4


def _counters(natives: List[Optional[int]]) -> Dict[str, List[Optional[int]]]:
    """native_id -> [CPU ticks, wake-ups] of each thread, as engine/hang.py reads a local one's."""
    return {str(native): [thread_cpu_ticks("self", native), thread_wakeups("self", native)]
            for native in natives if native is not None}  # fmt: skip


def _tasks_into(builder: TableBuilder, exclude: Any) -> Optional[List[str]]:
    """This moment's python.asyncio_tasks rows appended; their notes, or None without asyncio."""
    if "asyncio" not in sys.modules:
        return None
    from .asyncio_tasks import asyncio_task_rows

    rows, notes = asyncio_task_rows(exclude, Pacer())
    for row in rows:
        builder.append(row)
    return notes


def _tables_asked(params: Dict[str, Any]) -> Tuple[List[str], Dict[str, Any]]:
    """The tables to build after the window and their parameters, checked before it begins."""
    names = params.get("tables") or []
    if not isinstance(names, list) or len(names) > MAX_TABLES or not all(isinstance(n, str) for n in names):
        raise RequestError(ErrorKind.BAD_REQUEST, f"tables must be a list of at most {MAX_TABLES} names")
    table_params = params.get("table_params") or {}
    if not isinstance(table_params, dict):
        raise RequestError(ErrorKind.BAD_REQUEST, "table_params must be an object")
    float_param(table_params, "scan_budget_s", 1.0, 0.0, float("inf"))
    float_param(table_params, "step_wait_s", 1.0, 0.0, 600.0)
    return names, table_params


def _tables_after(
    server: Any, names: List[str], table_params: Dict[str, Any], chunks: List[Any]
) -> List[Dict[str, Any]]:
    """The tables `names`, built now and their chunks added to `chunks`: each with its `offset`
    in the payload, or the `error` that kept it (a table this agent has not)."""
    from .tables import BUILDERS

    built: List[Dict[str, Any]] = []
    for name in names:
        if name not in BUILDERS:
            built.append({"name": name, "error": f"no table {name!r:.200}"})
            continue
        try:
            descriptor, more = BUILDERS[name](server, dict(table_params, name=name)).encode()
        except RequestError as error:
            built.append({"name": name, "error": error.message})
            continue
        built.append({"name": name, "table": descriptor, "offset": sum(len(chunk) for chunk in chunks)})
        chunks.extend(more)
    return built


def watch(server: Any, params: Dict[str, Any]) -> Tuple[Dict[str, Any], List[Any]]:
    """`samples` samples spread over `duration` seconds. The reply: the python.backtrace rows of
    every sample in one table (`table`), and per sample (`samples`) when it was taken (seconds
    from the first), its rows ([start, end) in the table), its threads' counters and its
    python.asyncio_tasks rows (in `tasks`, a second table after the first in the payload); then
    the tables `tables` names, built once the window is over (`tables`, _tables_after)."""
    duration = float_param(params, "duration", 10.0, 0.0, MAX_DURATION_S)
    samples = int_param(params, "samples", 2) or 10
    if samples > MAX_SAMPLES:
        raise RequestError(ErrorKind.BAD_REQUEST, f"samples must be at most {MAX_SAMPLES}, not {samples}")
    names, table_params = _tables_asked(params)
    exclude = server.own_threads
    stacks = TableBuilder(BACKTRACE.name, BACKTRACE.column_types())
    tasks = TableBuilder(ASYNCIO_TASKS.name, ASYNCIO_TASKS.column_types())
    taken: List[Dict[str, Any]] = []
    notes: List[str] = []
    interval = duration / (samples - 1)
    started = monotonic()
    for index in range(samples):
        first, first_task = stacks.rows, tasks.rows
        natives: List[Any] = []
        for row in backtrace_rows(exclude, None, False, 200):
            stacks.append(row)
            natives.append(row[NATIVE_ID])
        counters = _counters(list(dict.fromkeys(natives)))
        moment = monotonic() - started
        task_notes = _tasks_into(tasks, exclude)
        notes.extend(note for note in task_notes or () if note not in notes)
        taken.append({"taken": moment, "rows": [first, stacks.rows], "counters": counters,
                      "tasks": [first_task, tasks.rows] if task_notes is not None else None})  # fmt: skip
        if index < samples - 1:
            sleep(max(0.0, started + interval * (index + 1) - monotonic()))
    descriptor, chunks = stacks.encode()
    result: Dict[str, Any] = {"table": descriptor, "samples": taken, "pid": os.getpid()}
    if notes:
        result["notes"] = notes
    if tasks.rows:
        result["tasks"], more = tasks.encode()
        result["tasks_offset"] = sum(len(chunk) for chunk in chunks)
        chunks = chunks + more
    result["tables"] = _tables_after(server, names, table_params, chunks)
    return result, chunks
