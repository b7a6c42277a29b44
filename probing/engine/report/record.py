"""What `probing FILE report` shows of a record: the same page as a live job's, from the tables
the record holds, with why it was written and the exception that ended the job at the top. No
hang verdict: that takes samples over time of a live process (record_reports.py says so)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Set, cast

from ...schema.tables import PYTHON_GC
from ..records.fields import integer, number, text
from ..records.record import Record, backtrace_rows
from ..records.reports import record_hang
from ..records.sql import record_session
from ..sources import reader_for_owner
from .live import TORCH_TABLES, Report, describe_threads
from .sources import ReportSources
from .tables import (
    held_tables,
    largest_tensors,
    memory_history,
    nan_events,
    slowest_modules,
    step_times,
    thread_details,
)
from .threads import fold_threads

if TYPE_CHECKING:
    from ...schema.rows import BacktraceRow, GcRow
    from .live import CodedFrame

OBJECT_TYPES_SHOWN = 15


def gc_rows(record: Record) -> List[GcRow]:
    """python.gc as the record holds it, typed as the schema has it: reading the record refused a
    table whose columns have other types (records/record.py)."""
    return cast("List[GcRow]", record.rows(PYTHON_GC.name))


def _object_types(record: Record) -> List[Dict[str, Any]]:
    """python.gc as the record holds it, largest first (most records hold none: it is counted
    at the time of a query, not kept)."""
    rows = [row for row in gc_rows(record) if isinstance(row.get("type"), str)]
    rows.sort(key=lambda row: -(number(row.get("size_mb")) or 0.0))
    return [
        {"type": row["type"], "count": integer(row.get("count")), "size_mb": number(row.get("size_mb")),
         "cuda_mb": number(row.get("cuda_mb"))}
        for row in rows[:OBJECT_TYPES_SHOWN]
    ]  # fmt: skip


def _process(record: Record) -> Dict[str, Any]:
    """The page's process section, from the record's header."""
    info = record.info()
    rank = record.rank()
    header_started = number(record.header.get("started_at"))
    written = record.written_at
    return {
        "pid": info["pid"],
        "argv": info["argv"],
        "python_version": info["python_version"],
        "executable": text(record.header.get("executable")),
        "cwd": text(record.header.get("cwd")),
        "probing_version": text(record.header.get("probing_version")),
        "torch_version": text(record.header.get("torch_version")),
        "started_at": header_started,
        "uptime_s": written - header_started if written is not None and header_started is not None else None,
        "rank": rank["rank"] if rank else None,
        "local_rank": rank["local_rank"] if rank else None,
        "world_size": rank["world_size"] if rank else None,
        "node": record.header.get("hostname") if rank else None,
    }


def _absent(types: List[Dict[str, Any]], held: Set[str], torch_seen: bool) -> Dict[str, str]:
    """The sections a record cannot fill, and why."""
    absent: Dict[str, str] = {
        "hang": "a record holds one snapshot of a job that has ended: whether its threads progressed "
        "cannot be told from it"
    }
    if not types:
        absent["object_types"] = (
            "the record holds no object census (python.gc is counted when asked, not kept)"
        )
    if torch_seen and "python.tensors" not in held:
        absent["tensors"] = "the record holds no tensors (python.tensors)"
    if not torch_seen:
        absent["torch"] = "the record holds no torch tables (torch was not traced, or not imported)"
    elif "python.torch_trace" not in held:
        absent["steps"] = "the record holds no traced steps (trace was off)"
    return absent


def gather_record(record: Record) -> Report:
    started = time.monotonic()
    sources = ReportSources(None, reader_for_owner(*record.owner))

    def code_line(frame: BacktraceRow) -> str:
        return sources.line(str(frame["file"]), frame["lineno"])

    session = record_session(record)
    held = held_tables(session, TORCH_TABLES)
    nans, nan_steps, nan_count = nan_events(session)
    snapshot = record_hang(record, code_line)
    states = {(thread["thread_id"], thread["native_id"]): thread["state"] for thread in snapshot["threads"]}
    rows: List[CodedFrame] = [
        {**row, "code": code_line(row) if row["frame_type"] != "Native" else None}
        for row in backtrace_rows(record)
    ]
    threads = describe_threads(
        rows,
        lambda frames: states.get((frames[0]["thread_id"], frames[0]["native_id"]), ""),
        thread_details(session),
    )
    written = record.written_at
    types = _object_types(record)
    # A torch object's type is named from its module: torch.Tensor, torch.nn.Parameter...
    torch_seen = bool(held) or any(str(row.get("type")).startswith("torch.") for row in gc_rows(record))
    absent = _absent(types, held, torch_seen)
    process = _process(record)
    shown, left_out = fold_threads(threads)
    return Report(
        process=process, threads=shown, stacks_source="record", hang=None,
        record={"path": record.path, "kind": record.kind, "written_at": written,
                "reason": record.reason(), "exception": record.exception(),
                "stuck": snapshot["hung"], "verdict": snapshot["reason"]},
        steps=step_times(session), modules=slowest_modules(session), memory=memory_history(session),
        nan_events=nans, nan_steps=nan_steps, nan_event_count=nan_count, object_types=types,
        tensors=largest_tensors(session), has_torch=torch_seen, absent=absent, notes=list(record.notes),
        timings={"total_s": time.monotonic() - started}, generated_at=time.time(),
        thread_count=len(threads), threads_left_out=left_out,
    )  # fmt: skip
