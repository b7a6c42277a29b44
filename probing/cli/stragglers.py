"""`probing PID stragglers`: which rank the job waits for, in which phase, and by how much."""

from __future__ import annotations

from typing import Optional

import click

from .invocation import Invocation
from .options import apply, pass_invocation
from .render import notes
from .render.stragglers import write_stragglers
from .spec import RANKS, TEXT_OR_JSON, timeout


@click.command()
@click.option(
    "--duration", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True, metavar="S",
    help="Seconds to watch the job.",
)  # fmt: skip
@apply(TEXT_OR_JSON, timeout(3.0, "Seconds to wait for each rank's agent."), RANKS)
@pass_invocation
def stragglers(
    invocation: Invocation, duration: float, format: str, timeout: float, ranks: Optional[str]
) -> int:
    """Which rank slows the job: each rank's step, computing and waiting, watched for a while.

    Every rank (--ranks all unless told otherwise) is watched over the same window: when it
    arrives at each collective (the job's own Flight Recorder), and where its main thread is
    (stack samples). A rank the others wait for at most collectives is a straggler; the verdict
    says by how much, what share of the step the job waits for it, and where its extra time
    goes (data loading, forward, backward, optimizer step, or its own code, with the frame).

    Exits 20 when a straggler is found, 0 when none is, 11 when the job is stuck rather than
    slow (`hang --ranks all` says where), 14 when some ranks could not be watched.
    """
    answer = invocation.kind(ranks or "all").stragglers(duration, timeout)
    notes(answer.notes)
    write_stragglers(answer.value, format)
    return answer.exit_code
