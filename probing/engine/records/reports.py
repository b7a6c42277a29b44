"""What `memory` and `hang` say about a record: computed from its tables, printed by
cli/render/record.py.

A record is one moment of a job that has ended. Its memory report is the history the agent
sampled (process.memory) up to the end, and torch's allocator as the last traced steps saw it;
nothing can be measured any more (no USS, no object scan, no growth window). Its hang report is
what each thread was doing in the one snapshot it holds: progress needs samples over time, so
a record cannot say a job was hung, only that the watchdog or a collective timeout said so
when it was written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from ...analysis.states import thread_state
from ..fatal_text import FAULTING_THREAD
from .fields import number, timestamp
from .record import Record, backtrace_rows

if TYPE_CHECKING:
    from ...schema.rows import BacktraceRow

# How many of the last memory samples the report lists.
LAST_SAMPLES = 10
# Reasons a record is written for that are themselves a verdict that the job was stuck.
STUCK_REASONS = {
    "watchdog": "the hang watchdog (probing run --hang-timeout) found the job stuck and ended it",
    "collective_timeout": "a collective timed out",
}


def record_memory(record: Record, last: int = LAST_SAMPLES) -> Dict[str, Any]:
    """The memory history a record holds: first, peak and last sample, the last `last`
    samples, and the torch allocator's numbers of the last traced step."""
    samples = sorted(
        (_sample(row) for row in record.rows("process.memory") if timestamp(row.get("ts")) is not None),
        key=lambda row: row["ts"],
    )
    answer: Dict[str, Any] = {
        "pid": record.pid,
        "record": record.path,
        "written_at": record.written_at,
        "samples": len(samples),
        "first": samples[0] if samples else None,
        "peak": max(samples, key=lambda row: number(row.get("rss_mb")) or 0.0) if samples else None,
        "last": samples[-1] if samples else None,
        "history": samples[-last:],
        "torch": _torch_memory(record),
        "tables": {name: record.row_count(name) for name in record.table_names()},
    }
    return answer


def _sample(row: Dict[str, Any]) -> Dict[str, Any]:
    """A process.memory row with each value of the type its column has, or None: the record is
    the job's, and a byte-swapped or hostile table holds NaN, 1e294 or text where MB are."""
    checked: Dict[str, Any] = {}
    for name, value in row.items():
        if name == "ts":
            checked[name] = timestamp(value)
        elif isinstance(value, float):
            checked[name] = number(value)
        else:
            checked[name] = value
    return checked


def _torch_memory(record: Record) -> Optional[Dict[str, Any]]:
    """torch's allocator at the last traced step: the most any traced call of it saw."""
    table = record.table("python.torch_trace")
    if table is None or table.rows == 0:
        return None
    names = [column.name for column in table.columns]
    if "step" not in names:
        return None
    steps = table.column("step").to_pylist()
    last_step = max((step for step in steps if isinstance(step, int)), default=None)
    if last_step is None:
        return None
    answer: Dict[str, Any] = {"step": last_step, "steps": len(set(steps))}
    for name in ("allocated", "max_allocated", "reserved"):
        if name not in names:
            answer[name] = None
            continue
        values = table.column(name).to_pylist()
        seen = [number(value) for step, value in zip(steps, values) if step == last_step]
        present = [value for value in seen if value is not None]
        answer[name] = max(present) if present else None
    return answer


def record_hang(record: Record, code_line: Callable[[BacktraceRow], str]) -> Dict[str, Any]:
    """Each thread's state in the record's snapshot, and what can honestly be said of progress:
    `hung` is True when the record was written because the job was found stuck, else None."""
    threads: Dict[Optional[int], List[BacktraceRow]] = {}
    for row in backtrace_rows(record):
        threads.setdefault(row["thread_id"], []).append(row)
    described = []
    for frames in threads.values():
        frames.sort(key=lambda row: row["depth"] or 0)
        first = frames[0]
        where = next((frame for frame in frames if frame["frame_type"] != "Native"), first)
        described.append(
            {
                "thread_id": first["thread_id"],
                "native_id": first["native_id"],
                "name": first["thread_name"],
                "is_main": bool(first["is_main"]),
                "state": _state(record, frames, code_line),
                "where": f"{where['func']} ({where['file']}:{where['lineno']})",
            }
        )
    described.sort(key=lambda thread: not thread["is_main"])
    kind = record.reason()["kind"]
    stuck = STUCK_REASONS.get(kind or "")
    return {
        "pid": record.pid,
        "record": record.path,
        "written_at": record.written_at,
        "snapshot": True,
        "hung": True if stuck else None,
        "reason": stuck
        or "a record holds one snapshot of a job that has ended: whether its threads were making "
        "progress cannot be told from it (that takes samples over time, of a live process)",
        "threads": described,
    }


def _state(record: Record, frames: List[BacktraceRow], code_line: Callable[[BacktraceRow], str]) -> str:
    """What the thread was doing; in a .fatal file, the faulting thread died where it stands."""
    if record.kind == "fatal" and frames[0]["thread_name"] == FAULTING_THREAD:
        return f"died of {record.reason()['message'] or 'a fatal signal'}"
    return thread_state(frames, code_line)
