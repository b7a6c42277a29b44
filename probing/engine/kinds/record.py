"""A record: the file a job's agent left when the job ended (or when asked), FILE.probing, or
the .fatal file of a fatal signal. It answers what a snapshot can: stacks, SQL over the tables it
holds, the hang verdict of its last look, memory, the page, the timeline, the module flame graph,
and an export; nothing that needs the process running.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ...errors import ExitCode
from ..records.record import Record as RecordFile
from ..records.stacks import record_stacks
from ..sources import SourceLines, reader_for_owner
from ..timeline import record_timeline
from .base import Kind, One, Rows

# Every click command loads this module (cli/hang.py, cli/memory.py, cli/export.py name its
# classes): what one operation alone needs is imported by that operation.


class FromRecord:
    """What a record answered (`value`: stacks, a hang verdict, memory), with the record, whose
    heading the text shows first."""

    __slots__ = ("record", "value")

    def __init__(self, record: RecordFile, value: Any) -> None:
        self.record = record
        self.value = value


class Record(Kind):
    described = "a record of a job that has ended"

    def __init__(self, text: str, command: str, record: RecordFile) -> None:
        super().__init__(text, command)
        self.record = record
        self.source = record.path

    def stacks(
        self, locals: bool, thread: Optional[str], timeout: float, native: bool, children: bool,
        attach_children: bool,
    ) -> One:  # fmt: skip
        self.refuse_live_stacks(native, children or attach_children)
        return One(FromRecord(self.record, record_stacks(self.record, locals, thread)))

    def query(self, sql: str, timeout: float, scan_budget: float, step_wait: float) -> One:
        from ..records.sql import query_record  # DuckDB, ~60 ms: loaded for SQL alone

        answer = query_record(self.record, sql)
        return One(Rows(answer.columns, answer.types, answer.rows, answer.notes))

    def describe(self, timeout: float) -> One:
        return One(self.record.described())

    def hang(self, duration: float, samples: int, timeout: float, carriers: Sequence[str]) -> One:
        if carriers:
            raise self.not_for("hang --thread")
        sources = SourceLines(None, reader_for_owner(*self.record.owner))

        from ..records.reports import record_hang

        report = record_hang(self.record, sources.frame_line)
        return One(FromRecord(self.record, report), ExitCode.HUNG if report["hung"] else ExitCode.OK)

    def memory(
        self, growth: Optional[float], cuda_snapshot: bool, interval: Optional[float], top: int,
        timeout: float, scan_budget: float, live_options: Sequence[str],
    ) -> One:  # fmt: skip
        if live_options:
            raise self.not_for(f"memory {live_options[0]}")
        from ..records.reports import record_memory

        return One(FromRecord(self.record, record_memory(self.record)))

    def report(self, timeout: float, hang_duration: float, hang_samples: int, tensors: bool) -> One:
        from ..report.record import gather_record  # DuckDB (records.sql)

        gathered = gather_record(self.record)
        return One(gathered, ExitCode.PARTIAL if gathered.failures else ExitCode.OK)

    def timeline(self, steps: Any, timeout: float) -> One:
        return One(record_timeline(self.record, steps))

    def module_flame(self, steps: Optional[str], timeout: float) -> One:
        from ..flames.modules import torch_flame_of_record

        return One(torch_flame_of_record(self.record, steps))

    def export(self, directory: str, format: str, force: bool) -> One:
        """Every table as Parquet or CSV files in `directory`, and the header as record.json."""
        from ..records.sql import export_record  # DuckDB

        return One(export_record(self.record, directory, format, force), notes=self.record.notes)
