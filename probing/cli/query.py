"""`probing PID query SQL`: DuckDB SQL over the process's tables."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.query import load_job_tables, load_tables
from ..errors import ExitCode
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
    record = invocation.record()
    if record is not None:
        from ..engine.record_sql import query_record

        if ranks is not None:
            raise invocation.live_only("query --ranks")
        answer = query_record(record, text)
        notes(answer.notes)
        write_rows(answer.columns, answer.types, answer.rows, format)
        return ExitCode.OK
    if ranks is not None:
        job, chosen = invocation.job(ranks)
        tables = load_job_tables(
            chosen, invocation.rank_target, text, timeout, invocation.attach_timeout, scan_budget, step_wait
        )
        notes(tables.notes)
        if not tables.session.tables or len(tables.missing) == len(chosen):
            write_missing(tables.missing)
            return tables.missing[0].error.exit_code if tables.missing else ExitCode.OK
        result = tables.session.run(text)
        write_rows(result.columns, result.types, result.rows, format)
        write_missing(tables.missing)
        return ExitCode.PARTIAL if tables.missing else ExitCode.OK
    loaded = load_tables(invocation.target(), text, timeout, scan_budget, step_wait)
    notes(loaded.notes)
    result = loaded.session.run(text)
    write_rows(result.columns, result.types, result.rows, format)
    return ExitCode.OK
