"""`probing PID tables`: every table with its columns, types and what each column means."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.kinds import Ranks
from .invocation import Invocation
from .options import apply, pass_invocation
from .render.per_rank import write_job_tables
from .render.reports import write_tables
from .spec import RANKS, TEXT_OR_JSON, timeout


@click.command()
@apply(TEXT_OR_JSON, timeout(10.0), RANKS)
@pass_invocation
def tables(invocation: Invocation, format: str, timeout: float, ranks: Optional[str]) -> int:
    """Every table with its columns, types and what each column means (of a record: those it
    holds, with their row counts in --format json)."""
    answer = invocation.kind(ranks).describe(timeout)
    if isinstance(answer, Ranks):
        write_job_tables(answer.gathered, format)
    else:
        write_tables(answer.value, format)
    return answer.exit_code
