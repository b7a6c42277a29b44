"""The tables users query: names, columns, types and the documentation of every column.

A contract both sides import: the agent fills these tables (agent/tables.py), the CLI loads them
into DuckDB and prints their descriptions (`probing PID tables`, docs/tables.md). Standard
library only and Python 3.8 syntax, since the agent imports it inside the job.
"""

from __future__ import annotations

from .definition import Column, Table
from .torch_tables import (
    COLLECTIVE_TIMINGS,
    COLLECTIVES,
    CUDA_MEMORY,
    MODULES,
    NAN_EVENTS,
    OPTIMIZERS,
    PROCESS_GROUPS,
    TENSORS,
    TORCH_TRACE,
)  # fmt: skip

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing (and the re it imports) costs `probing PID backtrace` start-up
    from typing import Dict

# Torch's tables live in torch_tables.py; they are named here too, as every table is.
__all__ = [
    "COLLECTIVES", "CUDA_MEMORY", "MODULES", "NAN_EVENTS", "OPTIMIZERS", "PROCESS_GROUPS", "TENSORS",
    "TORCH_TRACE", "Column", "Table",
]  # fmt: skip


# What every table gains when the rows of many ranks go into one (--ranks): which process of the
# job each row came from, from torchrun's environment of that process.
RANK_COLUMNS = [
    Column("rank", "INTEGER", "global rank of the process the row came from (--ranks)"),
    Column("local_rank", "INTEGER", "rank of that process on its node (--ranks)"),
    Column("node", "INTEGER", "node of that process: torchrun's GROUP_RANK (--ranks)"),
]


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
        Column("alive", "BOOLEAN", "whether it still runs (false once threading marks it stopped)"),
        Column("cpu_user_s", "DOUBLE", "user CPU seconds used by the thread (/proc/self/task)"),
        Column("cpu_system_s", "DOUBLE", "system CPU seconds used by the thread (/proc/self/task)"),
    ],
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
)


ASYNCIO_TASKS = Table(
    "python.asyncio_tasks",
    "One row per coroutine frame of every pending asyncio task of the process, read at the time "
    "of the query without running anything on its event loops: each task's await chain from the "
    "coroutine it wraps inward (depth 0 is where it awaits now). A task with no frame to show has "
    "one row with NULL frame columns. At most 1 000 tasks are listed (parents before their children); "
    "the query says how many more there were and where they waited.",
    [
        Column("pid", "BIGINT", "process the task belongs to"),
        Column(
            "thread_id",
            "BIGINT",
            "Python ident of the thread running the task's loop; NULL while it runs none",
        ),
        Column("task_id", "BIGINT", "id() of the task: the same task in every row and every read"),
        Column("task_name", "VARCHAR", "Task.get_name(), e.g. Task-3"),
        Column(
            "state",
            "VARCHAR",
            "'running' (the loop runs it now), 'waiting' (on the future in awaits) or 'ready' "
            "(its next step is scheduled)",
        ),
        Column("coroutine", "VARCHAR", "the function of the coroutine the task wraps"),
        Column(
            "awaits",
            "VARCHAR",
            "what the task waits for: another task (task 'name'), a gather (gather of N), a Future; "
            "NULL when it waits for nothing",
        ),
        Column(
            "future_id", "BIGINT", "id() of the future it waits for: the same wait in two reads has the same"
        ),
        Column(
            "awaited_by",
            "BIGINT",
            "task_id of the task that waits for this one (directly, through a gather, or as its "
            "TaskGroup's owner); NULL for a task nobody awaits",
        ),
        Column(
            "depth", "BIGINT", "0 for the innermost coroutine frame (where the task awaits), then outwards"
        ),
        Column("func", "VARCHAR", "function name of the frame (code.co_name)"),
        Column("file", "VARCHAR", "source file path of the frame (code.co_filename)"),
        Column("lineno", "BIGINT", "current line of the frame: the await it is suspended at"),
    ],
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
            "(every sample for small jobs), NULL in the samples between; NULL throughout when one count "
            "would hold the GIL over 10 ms (a job that imported torch usually has too many objects)",
        ),
        Column("cuda_allocated_mb", "DOUBLE", "MB allocated by torch on all CUDA devices; NULL without CUDA"),
        Column("cuda_reserved_mb", "DOUBLE", "MB held by torch's CUDA caching allocator; NULL without CUDA"),
    ],
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
)


# The tables an agent serves.
AGENT_TABLES: Dict[str, Table] = {
    table.name: table
    for table in (
        BACKTRACE, THREADS, ASYNCIO_TASKS, PROCESS_INFO, PROCESS_MEMORY, TORCH_TRACE, NAN_EVENTS, MODULES,
        TENSORS, OPTIMIZERS, PYTHON_GC, GC_GENERATIONS, CUDA_MEMORY, COLLECTIVES, PROCESS_GROUPS,
    )
}  # fmt: skip

# Taken by the CLI itself, from outside the process (psutil): they need no agent.
PROCESS_STATS = Table(
    "process.stats",
    "A snapshot of the process from outside (psutil, read by the CLI at the time of the query; "
    "needs no agent): memory including USS, CPU times, I/O, open files, connections, children. "
    "What this user may not read is NULL.",
    [
        Column("pid", "BIGINT", "process id"),
        Column("name", "VARCHAR", "process name"),
        Column("status", "VARCHAR", "running, sleeping, disk-sleep, stopped, zombie, ..."),
        Column("create_time", "TIMESTAMP", "when the process started (UTC)"),
        Column("rss_mb", "DOUBLE", "resident set size, MB"),
        Column("vms_mb", "DOUBLE", "virtual memory size, MB"),
        Column("uss_mb", "DOUBLE", "unique set size: MB that would be freed if the process exited"),
        Column("pss_mb", "DOUBLE", "proportional set size: shared pages divided among their users, MB"),
        Column("swap_mb", "DOUBLE", "MB swapped out"),
        Column("shared_mb", "DOUBLE", "resident MB that could be shared with other processes"),
        Column("cpu_user_s", "DOUBLE", "user CPU seconds of the process"),
        Column("cpu_system_s", "DOUBLE", "system CPU seconds of the process"),
        Column("children_user_s", "DOUBLE", "user CPU seconds of its waited-for children"),
        Column("children_system_s", "DOUBLE", "system CPU seconds of its waited-for children"),
        Column("num_threads", "BIGINT", "OS threads"),
        Column("num_fds", "BIGINT", "open file descriptors"),
        Column("ctx_switches_voluntary", "BIGINT", "voluntary context switches (waits)"),
        Column("ctx_switches_involuntary", "BIGINT", "involuntary context switches (preemptions)"),
        Column("io_read_bytes", "BIGINT", "bytes read from storage"),
        Column("io_write_bytes", "BIGINT", "bytes written to storage"),
        Column("io_read_count", "BIGINT", "read system calls"),
        Column("io_write_count", "BIGINT", "write system calls"),
        Column("open_files", "VARCHAR[]", "paths of the regular files it has open"),
        Column(
            "connections",
            "VARCHAR[]",
            "its sockets, e.g. 'tcp 127.0.0.1:29500 -> 127.0.0.1:41234 ESTABLISHED'",
        ),
        Column("children", "BIGINT[]", "PIDs of its child processes (DataLoader workers, ...)"),
    ],
)

CLI_TABLES: Dict[str, Table] = {PROCESS_STATS.name: PROCESS_STATS}

# Made by the CLI of the tables of every rank (`query --ranks`), as views (probing/sql/derived.py).
JOB_TABLES: Dict[str, Table] = {COLLECTIVE_TIMINGS.name: COLLECTIVE_TIMINGS}
