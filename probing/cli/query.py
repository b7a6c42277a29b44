"""`probing PID query SQL`: DuckDB SQL over the process's tables."""

from __future__ import annotations

import click

from ..engine.query import load_tables
from ..errors import ExitCode
from .invocation import Invocation, read_argument
from .options import apply, pass_invocation
from .render import notes
from .render.rows import write_rows
from .spec import ROWS_FORMAT, scan_budget, timeout


@click.command()
@click.argument("sql")
@apply(
    ROWS_FORMAT,
    timeout(10.0, "Seconds to wait for each table."),
    scan_budget("Seconds the agent may spend walking live objects for python.tensors and python.gc."),
)
@click.option(
    "--step-wait", type=click.FloatRange(min=0, max=600), default=1.0, show_default=True, metavar="S",
    help="Seconds python.modules, python.tensors and python.optimizers wait for the job's next "
    "optimizer step, where gradients and tensor values are read.",
)  # fmt: skip
@pass_invocation
def query(
    invocation: Invocation, sql: str, format: str, timeout: float, scan_budget: float, step_wait: float
) -> int:
    """Run DuckDB SQL over the process's tables ('-' reads it from stdin)."""
    text = read_argument(sql, "SQL")
    loaded = load_tables(invocation.target(), text, timeout, scan_budget, step_wait)
    notes(loaded.notes)
    result = loaded.session.run(text)
    write_rows(result.columns, result.types, result.rows, format)
    return ExitCode.OK
