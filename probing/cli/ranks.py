"""`probing PID ranks`: every rank of the distributed job PID belongs to, and what each is doing."""

from __future__ import annotations

from typing import Optional

import click

from .invocation import Invocation
from .options import apply, pass_invocation
from .render.ranks import write_job_glance
from .spec import RANKS, ROW_FORMATS, Option, timeout

RANKS_FORMAT = Option(
    "--format",
    "text: the job and a table; json: one document (job, ranks); the others: the rank rows",
    default="text",
    choices=("text", *ROW_FORMATS),
)


@click.command()
@apply(
    RANKS,
    RANKS_FORMAT,
    timeout(3.0, "Seconds to wait for each rank's agent before reading its stacks from outside (py-spy)."),
)
@pass_invocation
def ranks(invocation: Invocation, ranks: Optional[str], format: str, timeout: float) -> int:
    """Every rank of the job: rank, local rank, node, PID, agent, what it is doing now.

    PID is any rank, a process under one (a DataLoader worker), the torchrun process, or a
    shell above it. Each rank's stacks are read once, in parallel: through its agent when one
    listens, else from outside with py-spy. Never attaches. Exits 14 when some ranks could not
    be looked at (their state says why).
    """
    answer = invocation.kind(ranks or "all", what="`ranks`").glance(timeout)
    write_job_glance(answer.value, format)
    return answer.exit_code
