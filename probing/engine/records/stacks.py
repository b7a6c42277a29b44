"""A record as the target of `probing FILE backtrace`: its stacks, as a live process's read."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

from ...errors import ProbingError
from ..backtrace import Stacks
from ..sources import SourceLines, reader_for_owner
from .record import Record, backtrace_rows

if TYPE_CHECKING:
    from ...schema.rows import BacktraceRow


def record_stacks(record: Record, locals: bool, thread: Optional[str]) -> Stacks:
    """The record's stacks as `probing PID backtrace` takes them: one thread (by name, Python
    ident or native id) if asked, the locals it holds only with `locals`. Source lines are read
    as the record's owner, and under no PID: the job that wrote it is gone, and its PID (from
    the untrusted header) may be another process's by now."""
    rows = _chosen_rows(record, locals, thread)
    info = dict(record.info(), pid=str(record.pid) if record.pid is not None else "?")
    return Stacks(None, rows, info, [], SourceLines(None, reader_for_owner(*record.owner)))


def _chosen_rows(record: Record, locals: bool, thread: Optional[str]) -> List[BacktraceRow]:
    rows = backtrace_rows(record)
    if thread is not None:
        chosen = [
            row
            for row in rows
            if thread in (str(row["thread_name"]), str(row["thread_id"]), str(row["native_id"]))
        ]
        if not chosen:
            names = ", ".join(dict.fromkeys(f"{row['thread_name']} ({row['thread_id']})" for row in rows))
            raise ProbingError(f"the record holds no thread named or numbered {thread!r}; threads: {names}")
        rows = chosen
    return rows if locals else [{**row, "locals": None} for row in rows]
