"""How the agent fills the tables it serves. What they are (names, columns, their
documentation) is the contract in schema/tables.py.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List

from .. import __version__
from ..procfs import process_start_time, thread_cpu_seconds
from ..schema.tables import (
    ASYNCIO_TASKS,
    BACKTRACE,
    COLLECTIVES,
    CUDA_MEMORY,
    GC_GENERATIONS,
    MODULES,
    NAN_EVENTS,
    OPTIMIZERS,
    PROCESS_GROUPS,
    PROCESS_INFO,
    PROCESS_MEMORY,
    PYTHON_GC,
    TENSORS,
    THREADS,
    TORCH_TRACE,
    Table,
)
from .columns import TableBuilder
from .identity import python_version, working_directory
from .imported import imported
from .pacing import Pacer, stall_bound
from .stacks import backtrace_rows, thread_stacks


def new_builder(table: Table) -> TableBuilder:
    return TableBuilder(table.name, table.column_types())


def _build_backtrace(server: Any, params: Dict[str, Any]) -> TableBuilder:
    builder = new_builder(BACKTRACE)
    rows = backtrace_rows(
        server.own_threads,
        params.get("thread"),
        bool(params.get("locals")),
        int(params.get("repr_limit") or 200),
    )
    for row in rows:
        builder.append(row)
    return builder


def _build_threads(server: Any, params: Dict[str, Any]) -> TableBuilder:
    builder = new_builder(THREADS)
    pid = os.getpid()
    for stack in thread_stacks(server.own_threads):
        user, system = thread_cpu_seconds(stack.native_id)
        builder.append((
            pid, stack.ident, stack.native_id, stack.name, stack.daemon, stack.is_main, stack.alive,
            user, system,
        ))  # fmt: skip
    return builder


def _build_asyncio_tasks(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .asyncio_tasks import asyncio_task_rows

    rows, notes = asyncio_task_rows(server.own_threads, Pacer())
    return _with_notes(_filled(new_builder(ASYNCIO_TASKS), rows), notes)


def _build_process_info(server: Any, params: Dict[str, Any]) -> TableBuilder:
    builder = new_builder(PROCESS_INFO)
    builder.append((
        os.getpid(), os.getppid(), list(sys.argv), working_directory(), sys.executable, python_version(),
        sys.implementation.name, process_start_time(), server.started_at, __version__,
    ))  # fmt: skip
    return builder


def _build_torch_trace(server: Any, params: Dict[str, Any]) -> Any:
    torchtrace = sys.modules.get(__package__ + ".pytorch.tracer")
    tracer = torchtrace.current() if torchtrace is not None else None
    if tracer is None:
        return new_builder(TORCH_TRACE)
    if tracer.pending_cuda:
        tracer.resolve_cuda()
    return tracer.ring


def _build_nan_events(server: Any, params: Dict[str, Any]) -> Any:
    torchtrace = sys.modules.get(__package__ + ".pytorch.tracer")
    tracer = torchtrace.current() if torchtrace is not None else None
    return tracer.nan_ring if tracer is not None else new_builder(NAN_EVENTS)


def _build_modules(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .pytorch.state import fill, module_rows

    rows, notes = module_rows(server.own_threads, step_wait(params))
    return _with_notes(fill(new_builder(MODULES), rows), notes)


def _build_tensors(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .memory.tensor_names import with_holders
    from .pytorch.state import DEFAULT_TENSOR_BUDGET_S, fill, tensor_rows

    budget = scan_budget(params, DEFAULT_TENSOR_BUDGET_S)
    rows, notes = tensor_rows(server.own_threads, budget, step_wait(params))
    # What holds the tensors that have no name: a walk of its own, with a budget as long.
    torch = imported("torch")
    parameter = getattr(getattr(torch, "nn", None), "Parameter", None)
    rows, held_notes = with_holders(rows, parameter if isinstance(parameter, type) else None, budget, Pacer())
    return _with_notes(fill(new_builder(TENSORS), rows), notes + held_notes)


def _build_optimizers(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .pytorch.state import fill, optimizer_rows

    rows, notes = optimizer_rows(server.own_threads, step_wait(params))
    return _with_notes(fill(new_builder(OPTIMIZERS), rows), notes)


def _build_collectives(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .memory.objects import release
    from .pacing import Pacer
    from .pytorch.collectives import collective_rows
    from .pytorch.flight_recorder import FREE_ENTRY_S

    rows, notes = collective_rows(server.own_threads)
    builder = _with_notes(_filled(new_builder(COLLECTIVES), rows), notes)
    release(rows, Pacer(), FREE_ENTRY_S)  # up to 10 000 rows: freed in slices
    return builder


def _build_process_groups(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .pytorch.collectives import process_group_rows

    rows, notes = process_group_rows()
    return _with_notes(_filled(new_builder(PROCESS_GROUPS), rows), notes)


def _filled(builder: TableBuilder, rows: List[Any]) -> TableBuilder:
    pacer = Pacer()
    for row in rows:
        pacer.pause_if_due()
        builder.append(row)
    return builder


def _with_notes(builder: TableBuilder, notes: List[str]) -> TableBuilder:
    builder.notes.extend(notes)
    return builder


def _build_process_memory(server: Any, params: Dict[str, Any]) -> Any:
    memory = sys.modules.get(__package__ + ".memory.sampler")
    sampler = memory.current() if memory is not None else None
    if sampler is None or sampler.ring is None:
        builder = new_builder(PROCESS_MEMORY)
        builder.notes.append(
            "process.memory is empty: sampling is off (probing PID memory --interval 1 starts it)"
        )
        return builder
    return sampler.ring


def _build_gc(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .memory.census import take_census

    census = take_census(scan_budget(params))
    builder = new_builder(PYTHON_GC)
    for row in census.rows():
        builder.append(row)
    builder.notes.extend(f"python.gc: {note}" for note in census.notes())
    return builder


def _build_gc_generations(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .memory.census import generation_rows

    rows, notes = generation_rows(stall_bound(scan_budget(params)))
    return _with_notes(_filled(new_builder(GC_GENERATIONS), rows), notes)


def _build_cuda_memory(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .memory.cuda import cuda_device_stats

    builder = new_builder(CUDA_MEMORY)
    found = cuda_device_stats()
    for device, stats in found:
        for key in sorted(stats):
            value = stats[key]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                builder.append((device, key, int(value)))
    if not found:
        builder.notes.append("torch.cuda_memory is empty: the process has not initialised CUDA")
    return builder


def scan_budget(params: Dict[str, Any], default: float = 1.0) -> float:
    """The seconds a walk over live objects may take: a positive number, at most an hour."""
    value = params.get("scan_budget_s")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
        return default
    return float(value)


def step_wait(params: Dict[str, Any]) -> float:
    """The seconds a torch table waits for the job's next optimizer step: 0 to 600."""
    from .pytorch.safepoint import DEFAULT_STEP_WAIT_S

    value = params.get("step_wait_s")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 600:
        return DEFAULT_STEP_WAIT_S
    return float(value)


# How the agent fills each table: a TableBuilder or a Ring (both have .encode()).
BUILDERS: Dict[str, Callable[[Any, Dict[str, Any]], Any]] = {
    BACKTRACE.name: _build_backtrace,
    THREADS.name: _build_threads,
    ASYNCIO_TASKS.name: _build_asyncio_tasks,
    PROCESS_INFO.name: _build_process_info,
    TORCH_TRACE.name: _build_torch_trace,
    NAN_EVENTS.name: _build_nan_events,
    MODULES.name: _build_modules,
    TENSORS.name: _build_tensors,
    OPTIMIZERS.name: _build_optimizers,
    PROCESS_MEMORY.name: _build_process_memory,
    PYTHON_GC.name: _build_gc,
    GC_GENERATIONS.name: _build_gc_generations,
    CUDA_MEMORY.name: _build_cuda_memory,
    COLLECTIVES.name: _build_collectives,
    PROCESS_GROUPS.name: _build_process_groups,
}
