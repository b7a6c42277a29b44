"""`probing PID hang`: watch every thread for a while; say what moved and what each is doing."""

from __future__ import annotations

from typing import Optional, Tuple

import click

from ..engine.kinds import Ranks
from ..engine.kinds.record import FromRecord
from .invocation import Invocation
from .options import apply, carrier_threads, pass_invocation
from .render import notes
from .render.job import write_job_hang
from .render.record import write_record_hang
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
    answer = invocation.kind(ranks).hang(duration, samples, timeout, carriers)
    notes(answer.notes)
    if isinstance(answer, Ranks):
        write_job_hang(answer.value, format)
    elif isinstance(answer.value, FromRecord):
        write_record_hang(answer.value.value, format)
    else:
        write_hang(answer.value, format)
    return answer.exit_code
