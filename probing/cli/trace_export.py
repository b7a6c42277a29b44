"""`probing TARGET trace export -o FILE`: python.torch_trace as a Chrome trace event file for
Perfetto or chrome://tracing, from a live job, every rank of it (--ranks), or a record."""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import click

from .. import __version__
from ..engine.timeline import EVERY_STEP, StepRange, TimelineRows, parse_steps
from ..errors import ExitCode
from .invocation import Invocation
from .pictures.timeline import HINT, Counted, ProcessTrack, Timeline, trace_document
from .render import notes
from .render.files import check_output, counted, write_output, wrote
from .render.per_rank import write_missing


def steps_option(
    context: click.Context, parameter: click.Parameter, value: Optional[str]
) -> Optional[StepRange]:
    """--steps A:B, A:, :B or N, checked as the command line is read (a usage error otherwise)."""
    if value is None:
        return None
    try:
        return parse_steps(value)
    except ValueError as error:
        raise click.BadParameter(f"{error}; give A:B, A:, :B or N", context, parameter) from None


def export_trace(
    invocation: Invocation, output: str, steps: Optional[StepRange], timeout: float, ranks: Optional[str]
) -> int:
    """Read the rows (engine), make the events (pictures), write the file (render)."""
    chosen = steps or EVERY_STEP
    check_output(output)  # a path that cannot be written fails before the job is asked anything
    target = invocation.kind(ranks, what="trace export --ranks")
    answer = target.timeline(chosen, timeout)
    rows = answer.value
    source = target.source
    notes(rows.notes)
    timeline = Timeline([ProcessTrack(key, pid, name) for key, pid, name in rows.processes])
    events = Counted(_events(timeline, rows))
    other: Dict[str, Any] = {
        "producer": f"probing {__version__}",
        "source": source,
        "steps": chosen.describe() if steps else "all",
        "clock": "wall clock, microseconds since the Unix epoch (UTC)",
    }
    size = write_output(output, trace_document(events, other))
    if timeline.skipped:
        notes([f"{timeline.skipped} rows without a finite duration left out"])
    processes = len(rows.processes)
    detail = f"{events.count:,} events, {counted(timeline.steps, 'step')}" + (
        f", {counted(processes, 'rank')}" if ranks else ""
    )
    wrote(output, size, detail, HINT)
    write_missing(rows.missing)
    return ExitCode.PARTIAL if rows.missing else ExitCode.OK


def _events(timeline: Timeline, rows: TimelineRows) -> Iterator[str]:
    yield from timeline.process_events()
    yield from timeline.trace_events(rows.trace_rows())
    yield from timeline.nan_events(rows.nan_rows())
    yield from timeline.memory_events(rows.memory_rows())
