"""The tables the agent serves, with the documentation of every column.

`probing PID tables` prints these descriptions, and docs/ is generated from them, so a column
is documented exactly once: here.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, NamedTuple

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
    build: Callable[[Any, Dict[str, Any]], TableBuilder]

    def new_builder(self) -> TableBuilder:
        return TableBuilder(self.name, [(column.name, column.type) for column in self.columns])

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

TABLES: Dict[str, Table] = {table.name: table for table in (BACKTRACE, THREADS, PROCESS_INFO)}
