"""`probing PID tables`: every table with its columns, types and what each column means."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.query import describe_tables
from ..errors import ExitCode
from .invocation import Invocation
from .options import apply, pass_invocation
from .render.reports import write_tables
from .spec import RANKS, TEXT_OR_JSON, timeout


@click.command()
@apply(TEXT_OR_JSON, timeout(10.0), RANKS)
@pass_invocation
def tables(invocation: Invocation, format: str, timeout: float, ranks: Optional[str]) -> int:
    """Every table with its columns, types and what each column means (of a record: those it
    holds, with their row counts in --format json)."""
    record = invocation.record()
    if record is not None:
        if ranks is not None:
            raise invocation.live_only("tables --ranks")
        write_tables(record.described(), format)
        return ExitCode.OK
    if ranks is not None:
        from ..engine.fanout import gather
        from .render.per_rank import write_job_tables

        _, chosen = invocation.job(ranks)
        gathered = gather(
            chosen,
            lambda rank: describe_tables(invocation.rank_target(rank), timeout),
            invocation.attach_timeout + timeout + 1.0,
        )
        write_job_tables(gathered, format)
        return gathered.exit_code()
    write_tables(describe_tables(invocation.target(), timeout), format)
    return ExitCode.OK
