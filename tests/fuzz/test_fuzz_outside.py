"""What the CLI reads from outside a process: py-spy's dump (outside/pyspy.py) and the core
reader's document (outside/core.py, engine/core.py). py-spy reads the job's memory and pystack
reads a core the job's process wrote: both print what the job controls.

The answers are checked as the CLI then uses them: python.backtrace rows of the schema's types
(they go into DuckDB), py-spy's threads with fields of the types their consumers read, a thread
state for each thread, the core's stacks rendered and queried."""

from __future__ import annotations

import io
from typing import Any, Dict, List, Optional, Tuple

from harness import BYTES, SCRATCH_BYTES, fuzzes, json_texts, json_values, rows_problem, text_values

from probing.analysis.states import thread_state
from probing.engine.core import core_session, only_thread, query_core
from probing.outside.core import CoreReading, parse_reading
from probing.outside.pyspy import gil_holder, rows_from_dump, threads_of
from probing.schema.tables import BACKTRACE

PID = 4461  # the process of most captured dumps: its main thread is the one with this native id
JSON = BYTES + (json_values(),) * 6
SCRATCH = SCRATCH_BYTES | json_texts()

# The type each field of a thread py-spy printed has for the code that reads it (engine/
# backtrace.py, analysis/states.py, glance.py, progress.py): int, text, bool or None.
THREAD_FIELDS = {"os_thread_id": int, "thread_id": int, "thread_name": str, "owns_gil": bool, "active": bool}
FRAME_FIELDS = {"name": str, "filename": str, "module": str, "short_filename": str, "line": int}


def field_problem(where: str, value: Dict[str, Any], fields: Dict[str, type]) -> Optional[str]:
    for name, kind in fields.items():
        got = value.get(name)
        if got is not None and (not isinstance(got, kind) or (kind is int and isinstance(got, bool))):
            return f"{where}: {name} is {type(got).__name__} {str(got)[:80]!r}"
    return None


def pyspy_problem(answer: Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]) -> Optional[str]:
    threads, rows = answer
    for thread in threads:
        problem = field_problem("a thread", thread, THREAD_FIELDS)
        if problem is None and not isinstance(thread.get("frames", []), list):
            problem = f"a thread's frames are {type(thread.get('frames')).__name__}"
        for frame in thread.get("frames") or []:
            problem = problem or field_problem("a frame", frame, FRAME_FIELDS)
        if problem is not None:
            return problem
    return rows_problem(BACKTRACE.column_types(), rows)


def as_the_engine_reads(threads: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """engine/backtrace.py from_outside: rows, the GIL's holder, each thread's state."""
    rows = rows_from_dump(PID, threads)
    gil_holder(threads)
    outside = {thread.get("os_thread_id"): thread for thread in threads}
    by_thread: Dict[Any, List[Dict[str, Any]]] = {}
    for row in rows:
        by_thread.setdefault(row["native_id"], []).append(row)
    for native_id, frames in by_thread.items():
        thread_state(frames, lambda frame: "", outside.get(native_id))
    return rows


@fuzzes("pyspy", examples=300, mutations=JSON, scratch=SCRATCH, answer=pyspy_problem, pattern="*.json")
def test_pyspy_dumps(data: bytes) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """An input is what py-spy printed on stdout."""
    threads = threads_of(PID, data, b"")
    return threads, as_the_engine_reads(threads)


@fuzzes("pyspy", examples=40, mutations=BYTES + (text_values(),) * 3, pattern="*.stderr")
def test_pyspy_failures(data: bytes) -> Any:
    """An input is what a failing py-spy printed on stderr (its stdout empty)."""
    return threads_of(PID, b"", data)


def core_problem(answer: Tuple[CoreReading, Any]) -> Optional[str]:
    reading, _ = answer
    return rows_problem(BACKTRACE.column_types(), reading.rows)


def as_the_cli_shows(reading: CoreReading) -> Any:
    """cli/core.py: the stacks rendered as text and as rows, one thread's, and SQL over them."""
    from probing.cli.render.core import write_core
    from probing.engine.core import CoreStacks

    for format in ("text", "json"):
        write_core(CoreStacks(reading), format, io.StringIO())
    if reading.rows:
        only_thread(reading.rows, str(reading.rows[-1]["native_id"]))
    core_session(reading)
    return query_core(reading, "SELECT thread_name, func, file, lineno, locals FROM python.backtrace").rows


@fuzzes("core", examples=160, mutations=JSON, scratch=SCRATCH, answer=core_problem)
def test_core_reader_documents(data: bytes) -> Tuple[CoreReading, Any]:
    """An input is what outside/core_reader.py printed on stdout (exit status 0)."""
    reading = parse_reading("core.1", 0, data, b"")
    return reading, as_the_cli_shows(reading)


@fuzzes("core", examples=30, mutations=BYTES + (text_values(),) * 3)
def test_core_reader_failures(data: bytes) -> Any:
    """An input is what a core reader killed by a signal printed on stderr."""
    return parse_reading("core.1", -11, b"", data)
