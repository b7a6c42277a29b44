"""`probing PID hang`: watch every thread for a while; say what moved and what each is doing."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import click

from ..engine.hang import sample_hang
from ..engine.sources import SourceLines, reader_for_owner
from ..errors import ExitCode
from .invocation import Invocation
from .options import apply, carrier_threads, pass_invocation
from .render.reports import write_hang
from .spec import RANKS, TEXT_OR_JSON, timeout


@click.command()
@click.option(
    "--duration", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True, metavar="S",
    help="Seconds to watch.",
)  # fmt: skip
@click.option(
    "--samples", type=click.IntRange(min=2), default=10, show_default=True, help="Stack samples to take."
)
@apply(
    TEXT_OR_JSON,
    timeout(3.0, "Seconds to wait for each sample from the agent before reading from outside."),
    RANKS,
)
@carrier_threads
@pass_invocation
def hang(
    invocation: Invocation,
    duration: float,
    samples: int,
    format: str,
    timeout: float,
    ranks: Optional[str],
    carriers: Tuple[str, ...],
) -> int:
    """Watch every thread for a while: what moved, what did not, what each is doing.

    Exits 11 when no thread that carries the process moved or used the CPU, 0 when one did. The
    verdict says which threads decided: the main thread; the threads it joins, or supervises
    while it only loops on a wait (`while True: time.sleep(1)`); or those named with --thread.
    A DataLoader wait leads to the worker that holds the batch.

    With --ranks, every rank over the same window and one verdict for the job: which ranks have
    not reached the collective the others wait in, and where they are; collectives that do not
    match across ranks. Exits 11 when the job is stuck, 14 when some ranks could not be watched.
    """
    record = invocation.record()
    if record is not None:
        from ..engine.record_reports import record_hang
        from .render.record import write_record_hang

        if ranks is not None:
            raise invocation.live_only("hang --ranks")
        if carriers:
            raise invocation.live_only("hang --thread")
        sources = SourceLines(None, reader_for_owner(*record.owner))
        report = record_hang(record, lambda frame: sources.line(str(frame.get("file")), frame.get("lineno")))
        write_record_hang(report, format)
        return ExitCode.HUNG if report["hung"] else ExitCode.OK
    if ranks is not None:
        from ..engine.job_hang import watch_job
        from .render import notes
        from .render.job import write_job_hang

        _, chosen = invocation.job(ranks)
        watched = watch_job(
            chosen, invocation.rank_target, duration, samples, timeout, invocation.attach_timeout, carriers
        )
        notes(watched.notes)
        write_job_hang(watched.verdict, format)
        if watched.verdict.hung:
            return ExitCode.HUNG
        if watched.failure_code is not None:
            return watched.failure_code
        return ExitCode.PARTIAL if watched.verdict.missing else ExitCode.OK
    target = invocation.target()
    pid: Optional[int] = None if target.remote else target.require_pid("hang")
    sources = SourceLines(pid)

    def code_line(frame: Dict[str, Any]) -> str:
        return sources.line(frame["file"], frame["lineno"])

    answer = sample_hang(target, duration, samples, timeout, code_line, carriers)
    write_hang(answer, format)
    return ExitCode.HUNG if answer.report.hung else ExitCode.OK
