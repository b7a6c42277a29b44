"""`probing PID query SQL`: DuckDB SQL over the process's tables."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.kinds import Ranks
from .invocation import Invocation, read_argument
from .options import apply, pass_invocation
from .render import notes
from .render.per_rank import write_missing
from .render.rows import write_rows
from .spec import RANKS, ROWS_FORMAT, scan_budget, timeout


@click.command()
@click.argument("sql")
@apply(
    ROWS_FORMAT,
    timeout(10.0, "Seconds to wait for each table."),
    scan_budget(
        "Seconds the agent may spend walking live objects for python.tensors and python.gc; a generation "
        "of gc's objects is listed only if that holds the job's GIL at most S/100 at once (10 ms at least)."
    ),
    RANKS,
)
@click.option(
    "--step-wait", type=click.FloatRange(min=0, max=600), default=1.0, show_default=True, metavar="S",
    help="Seconds python.modules, python.tensors and python.optimizers wait for the job's next "
    "optimizer step, where gradients and tensor values are read.",
)  # fmt: skip
@pass_invocation
def query(
    invocation: Invocation, sql: str, format: str, timeout: float, scan_budget: float, ranks: Optional[str],
    step_wait: float,
) -> int:  # fmt: skip
    """Run DuckDB SQL over the process's tables ('-' reads it from stdin).

    With --ranks, over the tables of every rank at once: each row carries its rank, local_rank
    and node (SELECT rank, func FROM python.backtrace WHERE depth = 0).
    """
    text = read_argument(sql, "SQL")
    answer = invocation.kind(ranks).query(text, timeout, scan_budget, step_wait)
    rows = answer.value
    notes(rows.notes)
    if rows.columns is not None:
        write_rows(rows.columns, rows.types, rows.rows, format)
    if isinstance(answer, Ranks):
        write_missing(answer.gathered.missing)
    return answer.exit_code
