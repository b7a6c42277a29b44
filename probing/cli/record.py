"""`probing PID record`: a record of a live job, now, without stopping it."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.record_request import request_record
from ..errors import ExitCode, RecordNotWritten
from .invocation import Invocation
from .options import apply, pass_invocation
from .render.record import write_not_recorded, write_recorded
from .spec import RANKS, TEXT_OR_JSON, timeout


@click.command()
@click.option("--reason", metavar="TEXT", help="Why it is written (kept in the record's header).")
@apply(TEXT_OR_JSON, timeout(10.0), RANKS)
@pass_invocation
def record(
    invocation: Invocation, reason: Optional[str], format: str, timeout: float, ranks: Optional[str]
) -> int:
    """Write a record of the live job now (every table its agent holds), without stopping it.

    The agent writes it under PROBING_RECORD_DIR, as it would at the job's end; the path, size and
    the time it took are printed. With --ranks, every rank writes its own. When the agent cannot
    write it (a full disk, a refused directory) the exit code is 18, and the reason is said (with
    --format json, on stdout too: {"pid", "path": null, "error", "exit_code"}).
    """
    if ranks is not None:
        from ..engine.fanout import gather
        from .render.per_rank import write_missing
        from .render.record import write_recorded_ranks

        _, chosen = invocation.job(ranks)
        gathered = gather(
            chosen,
            lambda rank: request_record(invocation.rank_target(rank), reason, timeout),
            invocation.attach_timeout + timeout + 31.0,
        )
        write_recorded_ranks(gathered.answers, format, gathered.missing)
        write_missing(gathered.missing)
        return gathered.exit_code()
    target = invocation.target()
    try:
        written = request_record(target, reason, timeout)
    except RecordNotWritten as error:
        # The agent answered: a script reading the JSON learns that no file was written, and why.
        write_not_recorded(target.pid, error, format)
        raise
    write_recorded(written, format)
    return ExitCode.OK
