"""The tables the agent serves, with the documentation of every column.

`probing PID tables` prints these descriptions, and docs/ is generated from them, so a column
is documented exactly once: here.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

from .. import __version__
from .columns import TableBuilder
from .procfs import process_start_time, thread_cpu_seconds
from .stacks import backtrace_rows, thread_stacks


class Column(NamedTuple):
    name: str
    type: str
    doc: str


class Table(NamedTuple):
    name: str
    doc: str
    columns: List[Column]
    build: Callable[[Any, Dict[str, Any]], Any]  # returns a TableBuilder or a Ring: .encode()

    def column_types(self) -> List[Tuple[str, str]]:
        return [(column.name, column.type) for column in self.columns]

    def new_builder(self) -> TableBuilder:
        return TableBuilder(self.name, self.column_types())

    def describe(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "doc": self.doc,
            "columns": [{"name": c.name, "type": c.type, "doc": c.doc} for c in self.columns],
        }


def _build_backtrace(server: Any, params: Dict[str, Any]) -> TableBuilder:
    builder = BACKTRACE.new_builder()
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
    builder = THREADS.new_builder()
    pid = os.getpid()
    for stack in thread_stacks(server.own_threads):
        thread = stack.thread
        user, system = thread_cpu_seconds(stack.native_id)
        builder.append((
            pid, stack.ident, stack.native_id, stack.name,
            thread.daemon if thread is not None else None, stack.is_main,
            thread.is_alive() if thread is not None else True, user, system,
        ))  # fmt: skip
    return builder


def _build_process_info(server: Any, params: Dict[str, Any]) -> TableBuilder:
    builder = PROCESS_INFO.new_builder()
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    builder.append((
        os.getpid(), os.getppid(), list(sys.argv), cwd, sys.executable, python_version(),
        sys.implementation.name, process_start_time(), server.started_at, __version__,
    ))  # fmt: skip
    return builder


def _build_torch_trace(server: Any, params: Dict[str, Any]) -> Any:
    torchtrace = sys.modules.get(__package__ + ".pytorch.tracer")
    tracer = torchtrace.current() if torchtrace is not None else None
    if tracer is None:
        return TORCH_TRACE.new_builder()
    if tracer.pending_cuda:
        tracer.resolve_cuda()
    return tracer.ring


def _build_nan_events(server: Any, params: Dict[str, Any]) -> Any:
    torchtrace = sys.modules.get(__package__ + ".pytorch.tracer")
    tracer = torchtrace.current() if torchtrace is not None else None
    return tracer.nan_ring if tracer is not None else NAN_EVENTS.new_builder()


def _build_modules(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .pytorch.state import fill, module_rows

    rows, note = module_rows(server.own_threads, step_wait(params))
    return _with_notes(fill(MODULES.new_builder(), rows), [note] if note else [])


def _build_tensors(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .pytorch.state import DEFAULT_TENSOR_BUDGET_S, fill, tensor_rows

    budget = scan_budget(params, DEFAULT_TENSOR_BUDGET_S)
    rows, notes = tensor_rows(server.own_threads, budget, step_wait(params))
    return _with_notes(fill(TENSORS.new_builder(), rows), notes)


def _build_optimizers(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .pytorch.state import fill, optimizer_rows

    rows, note = optimizer_rows(server.own_threads, step_wait(params))
    return _with_notes(fill(OPTIMIZERS.new_builder(), rows), [note] if note else [])


def _with_notes(builder: TableBuilder, notes: List[str]) -> TableBuilder:
    builder.notes.extend(notes)
    return builder


def _build_process_memory(server: Any, params: Dict[str, Any]) -> Any:
    memory = sys.modules.get(__package__ + ".memory.census")
    sampler = memory.current() if memory is not None else None
    if sampler is None or sampler.ring is None:
        builder = PROCESS_MEMORY.new_builder()
        builder.notes.append(
            "process.memory is empty: sampling is off (probing PID memory --interval 1 starts it)"
        )
        return builder
    return sampler.ring


def _build_gc(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .memory.census import take_census

    census = take_census(scan_budget(params))
    builder = PYTHON_GC.new_builder()
    for row in census.rows():
        builder.append(row)
    note = census.note()
    if note:
        builder.notes.append(f"python.gc: {note}")
    return builder


def _build_gc_generations(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .memory.census import generation_rows

    builder = GC_GENERATIONS.new_builder()
    for row in generation_rows():
        builder.append(row)
    return builder


def _build_cuda_memory(server: Any, params: Dict[str, Any]) -> TableBuilder:
    from .memory.census import cuda_device_stats

    builder = CUDA_MEMORY.new_builder()
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


def python_version() -> str:
    info = sys.version_info
    text = f"{info.major}.{info.minor}.{info.micro}"
    if info.releaselevel != "final":
        text += f"{info.releaselevel[0]}{info.serial}"
    return text


BACKTRACE = Table(
    "python.backtrace",
    "One row per frame of every Python thread of the process, read at the time of the query.",
    [
        Column("pid", "BIGINT", "process the frame belongs to"),
        Column("thread_id", "BIGINT", "Python thread ident (threading.get_ident())"),
        Column("native_id", "BIGINT", "OS thread id (what top -H and py-spy show)"),
        Column("thread_name", "VARCHAR", "threading.Thread name"),
        Column("is_main", "BOOLEAN", "whether this is the main thread"),
        Column("depth", "BIGINT", "0 for the innermost frame (where the thread is now), then outwards"),
        Column("func", "VARCHAR", "function name (code.co_name)"),
        Column("file", "VARCHAR", "source file path (code.co_filename)"),
        Column("lineno", "BIGINT", "current line, as traceback.extract_stack reports it"),
        Column("frame_type", "VARCHAR", "'Python' or 'Native'"),
        Column("locals", "JSON", "{name: bounded repr} of the frame's locals; NULL unless asked for"),
        Column("source", "VARCHAR", "who read the frame: 'agent' or 'py-spy'"),
    ],
    _build_backtrace,
)

THREADS = Table(
    "python.threads",
    "One row per Python thread of the process (the agent's own threads left out).",
    [
        Column("pid", "BIGINT", "process the thread belongs to"),
        Column("thread_id", "BIGINT", "Python thread ident"),
        Column("native_id", "BIGINT", "OS thread id; NULL for threads not started by threading"),
        Column("name", "VARCHAR", "threading.Thread name"),
        Column("daemon", "BOOLEAN", "whether the thread is a daemon thread"),
        Column("is_main", "BOOLEAN", "whether this is the main thread"),
        Column("alive", "BOOLEAN", "Thread.is_alive()"),
        Column("cpu_user_s", "DOUBLE", "user CPU seconds used by the thread (/proc/self/task)"),
        Column("cpu_system_s", "DOUBLE", "system CPU seconds used by the thread (/proc/self/task)"),
    ],
    _build_threads,
)

PROCESS_INFO = Table(
    "process.info",
    "One row describing the process and the agent in it.",
    [
        Column("pid", "BIGINT", "process id"),
        Column("ppid", "BIGINT", "parent process id"),
        Column("argv", "VARCHAR[]", "sys.argv"),
        Column("cwd", "VARCHAR", "current working directory"),
        Column("executable", "VARCHAR", "sys.executable"),
        Column("python_version", "VARCHAR", "e.g. 3.11.7"),
        Column("implementation", "VARCHAR", "sys.implementation.name, e.g. cpython"),
        Column("start_time", "TIMESTAMP", "when the process started (UTC)"),
        Column("agent_start_time", "TIMESTAMP", "when the agent started serving (UTC)"),
        Column("probing_version", "VARCHAR", "version of the agent in the process"),
    ],
    _build_process_info,
)

TORCH_TRACE = Table(
    "python.torch_trace",
    "One row per traced module call (forward, and backward with `trace on --backward`) and per "
    "optimizer step, recorded while `probing PID trace on` (or PROBING_TORCH_TRACE=1) is in effect. "
    "A ring buffer: the newest rows, up to `trace on --capacity` (1 M by default).",
    [
        Column("step", "BIGINT", "optimizer step the call belongs to, counted from 0 when tracing began"),
        Column("seq", "BIGINT", "order of the call's start within its step (micro-batches keep counting)"),
        Column(
            "module", "VARCHAR", "qualified module name, e.g. model.layers.0.attn; the optimizer's for steps"
        ),
        Column("module_type", "VARCHAR", "class name of the module or optimizer"),
        Column("stage", "VARCHAR", "'forward', 'backward' or 'optimizer'"),
        Column("duration", "DOUBLE", "seconds; CPU time between the hooks, or CUDA event time on a GPU"),
        Column("time_offset", "DOUBLE", "seconds from the start of the step to the start of the call"),
        Column(
            "allocated",
            "DOUBLE",
            "MB allocated by torch on the module's CUDA device after the call; NULL on CPU",
        ),
        Column("max_allocated", "DOUBLE", "MB, peak of allocated so far; NULL on CPU"),
        Column("reserved", "DOUBLE", "MB held by the CUDA caching allocator; NULL on CPU"),
        Column("rank", "BIGINT", "torch.distributed rank (RANK, or 0 when not distributed)"),
        Column("ts", "TIMESTAMP", "when the call started (UTC)"),
    ],
    _build_torch_trace,
)

NAN_EVENTS = Table(
    "python.nan_events",
    "The first module of each step whose output (forward) or input gradient (backward) held NaN "
    "or Inf, recorded while `probing PID nan on` is in effect.",
    [
        Column("step", "BIGINT", "optimizer step, as in python.torch_trace"),
        Column("seq", "BIGINT", "order of the offending call within its step"),
        Column("module", "VARCHAR", "qualified module name"),
        Column("module_type", "VARCHAR", "class name of the module"),
        Column("stage", "VARCHAR", "'forward' (its output) or 'backward' (the gradients it produced)"),
        Column(
            "tensor",
            "VARCHAR",
            "which tensor, its dtype, shape and device, e.g. output[0] float32[32, 10] on cpu",
        ),
        Column("nan_count", "BIGINT", "NaN values in that tensor"),
        Column("inf_count", "BIGINT", "Inf values in that tensor"),
        Column(
            "input_finite",
            "BOOLEAN",
            "whether what came in (inputs, or the output gradient) was finite: "
            "true means this module made the NaN/Inf",
        ),
        Column("rank", "BIGINT", "torch.distributed rank"),
        Column("ts", "TIMESTAMP", "when it was seen (UTC)"),
    ],
    _build_nan_events,
)

MODULES = Table(
    "python.modules",
    "Every module of the job's top-level models (found in __main__, in its threads' frames, or by "
    "gc), read at the time of the query; gradient norms are taken in the training thread at its next "
    "optimizer step (`query --step-wait`), or while the job is quiet, and are NULL with a note otherwise.",
    [
        Column("name", "VARCHAR", "qualified name: the model's variable name, then the submodule path"),
        Column("root", "VARCHAR", "name of the top-level module it belongs to"),
        Column("type", "VARCHAR", "class name"),
        Column("depth", "BIGINT", "0 for a top-level module, 1 for its children, ..."),
        Column("params", "BIGINT", "parameters (elements) of the module and its submodules"),
        Column("trainable_params", "BIGINT", "of those, the ones with requires_grad"),
        Column("device", "VARCHAR", "device of its first parameter; NULL without parameters"),
        Column("dtype", "VARCHAR", "dtype of its first parameter"),
        Column("training", "BOOLEAN", "module.training"),
        Column(
            "grad_norm", "DOUBLE", "L2 norm of the gradients of its own parameters; NULL when none has one"
        ),
        Column("has_nonfinite_grad", "BOOLEAN", "whether those gradients hold NaN or Inf"),
        Column("traced", "BOOLEAN", "whether `trace on` or `nan on` hooks are on it"),
    ],
    _build_modules,
)

TENSORS = Table(
    "python.tensors",
    "Live tensors: the models' parameters, gradients and buffers by name, then every other tensor "
    "gc finds, until a time budget (1 s) runs out; the query then says it was cut short. Gradients and "
    "grad_fn are read in the training thread at its next optimizer step, or while the job is quiet.",
    [
        Column(
            "name", "VARCHAR", "qualified parameter or buffer name (.grad for a gradient); NULL for others"
        ),
        Column("kind", "VARCHAR", "'parameter', 'gradient', 'buffer' or 'tensor'"),
        Column("shape", "VARCHAR", "e.g. [32, 256]"),
        Column("dtype", "VARCHAR", "e.g. float32"),
        Column("device", "VARCHAR", "e.g. cpu, cuda:0"),
        Column("bytes", "BIGINT", "elements times element size (views count the part they see)"),
        Column("requires_grad", "BOOLEAN", "tensor.requires_grad"),
        Column("is_param", "BOOLEAN", "whether it is an nn.Parameter"),
        Column("grad_fn", "VARCHAR", "autograd node that made it, e.g. AddmmBackward0; NULL for leaves"),
    ],
    _build_tensors,
)

OPTIMIZERS = Table(
    "python.optimizers",
    "One row per parameter group of every optimizer in the job; values held in tensors (a tensor lr, "
    "the step count) are read in the training thread at its next optimizer step, or while the job is quiet.",
    [
        Column("optimizer", "VARCHAR", "the variable that holds it, e.g. optimizer (or its class name)"),
        Column("type", "VARCHAR", "class name, e.g. AdamW"),
        Column("param_group", "BIGINT", "index of the parameter group"),
        Column("lr", "DOUBLE", "learning rate now (after any scheduler)"),
        Column("momentum", "DOUBLE", "momentum; NULL for optimizers without one"),
        Column("beta1", "DOUBLE", "betas[0] (Adam family); NULL otherwise"),
        Column("beta2", "DOUBLE", "betas[1]"),
        Column("weight_decay", "DOUBLE", "weight decay"),
        Column("params", "BIGINT", "parameters (tensors) in the group"),
        Column("numel", "BIGINT", "elements in those parameters"),
        Column("steps", "BIGINT", "steps taken, from the optimizer's state; NULL when it keeps no count"),
    ],
    _build_optimizers,
)

PROCESS_MEMORY = Table(
    "process.memory",
    "The process's memory over time: one row per sample, taken by the agent from /proc/self every "
    "second (PROBING_MEMORY_INTERVAL, or `probing PID memory --interval S`) since it started, the "
    "last 24 hours kept (PROBING_MEMORY_HISTORY).",
    [
        Column("ts", "TIMESTAMP", "when the sample was taken (UTC)"),
        Column("rss_mb", "DOUBLE", "resident set size, MB"),
        Column("vms_mb", "DOUBLE", "virtual memory size, MB"),
        Column(
            "cpu_percent",
            "DOUBLE",
            "CPU used by the whole process since the previous sample, in % of one core (the first: "
            "since the process started)",
        ),
        Column("num_threads", "BIGINT", "OS threads of the process"),
        Column("num_fds", "BIGINT", "open file descriptors"),
        Column(
            "gc_objects",
            "BIGINT",
            "objects tracked by gc; counted only as often as keeps counting under 0.03% of the time "
            "(every sample for small jobs), NULL in the samples between; never when one count would hold "
            "the GIL over 200 ms",
        ),
        Column("cuda_allocated_mb", "DOUBLE", "MB allocated by torch on all CUDA devices; NULL without CUDA"),
        Column("cuda_reserved_mb", "DOUBLE", "MB held by torch's CUDA caching allocator; NULL without CUDA"),
    ],
    _build_process_memory,
)

PYTHON_GC = Table(
    "python.gc",
    "Live objects by type: every object the garbage collector tracks (containers and class "
    "instances; numbers and strings count only in their containers' size), counted at the time of "
    "the query until a time budget (query --scan-budget, 1 s) runs out; the query then says it was "
    "cut short. gc generations are in python.gc_generations.",
    [
        Column("type", "VARCHAR", "qualified class name, e.g. torch.Tensor, __main__.Batch, dict"),
        Column("count", "BIGINT", "live objects of that type"),
        Column(
            "size_mb",
            "DOUBLE",
            "approximate MB: sys.getsizeof of each object (not what it refers to), plus the CPU "
            "storage of tensors, each storage counted once",
        ),
        Column(
            "cuda_mb", "DOUBLE", "tensor types: MB of their CUDA storage (each counted once); NULL otherwise"
        ),
    ],
    _build_gc,
)

GC_GENERATIONS = Table(
    "python.gc_generations",
    "The garbage collector's generations: what each holds and how often it was collected.",
    [
        Column("generation", "BIGINT", "0 (youngest), 1 or 2"),
        Column("objects", "BIGINT", "objects in the generation now"),
        Column("threshold", "BIGINT", "gc.get_threshold() for the generation"),
        Column(
            "pending",
            "BIGINT",
            "gc.get_count(): allocations (generation 0) or younger collections since its last collection",
        ),
        Column("collections", "BIGINT", "collections of the generation since the process started"),
        Column("collected", "BIGINT", "objects those collections freed"),
        Column("uncollectable", "BIGINT", "objects found uncollectable (left in gc.garbage)"),
        Column("enabled", "BOOLEAN", "gc.isenabled()"),
    ],
    _build_gc_generations,
)

CUDA_MEMORY = Table(
    "torch.cuda_memory",
    "torch.cuda.memory_stats() of every CUDA device, one row per counter; empty until the job has "
    "initialised CUDA (probing never initialises it).",
    [
        Column("device", "BIGINT", "CUDA device index"),
        Column(
            "stat",
            "VARCHAR",
            "counter name, e.g. allocated_bytes.all.current, reserved_bytes.all.peak, num_ooms",
        ),
        Column("value", "BIGINT", "its value (bytes for *_bytes counters)"),
    ],
    _build_cuda_memory,
)

TABLES: Dict[str, Table] = {
    table.name: table
    for table in (
        BACKTRACE, THREADS, PROCESS_INFO, PROCESS_MEMORY, TORCH_TRACE, NAN_EVENTS, MODULES, TENSORS,
        OPTIMIZERS, PYTHON_GC, GC_GENERATIONS, CUDA_MEMORY,
    )
}  # fmt: skip
