"""`probing PID record`: a record of a live job, now, without stopping it."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.kinds import Ranks
from ..engine.records.request import request_record
from ..errors import RecordNotWritten
from .invocation import Invocation
from .options import apply, pass_invocation
from .render.per_rank import write_missing
from .render.record import write_not_recorded, write_recorded, write_recorded_ranks
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
    kind = invocation.kind(ranks)
    try:
        answer = kind.each(lambda target: request_record(target, reason, timeout), timeout + 31.0)
    except RecordNotWritten as error:
        # One process's agent answered (a rank's refusal is gathered with the others): a script
        # reading the JSON learns that no file was written, and why.
        write_not_recorded(kind.process().pid, error, format)
        raise
    if isinstance(answer, Ranks):
        write_recorded_ranks(answer.gathered.answers, format, answer.gathered.missing)
        write_missing(answer.gathered.missing)
    else:
        write_recorded(answer.value, format)
    return answer.exit_code
