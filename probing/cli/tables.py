"""`probing PID tables`: every table with its columns, types and what each column means."""

from __future__ import annotations

import click

from ..engine.query import describe_tables
from ..errors import ExitCode
from .invocation import Invocation
from .options import apply, pass_invocation
from .render.reports import write_tables
from .spec import TEXT_OR_JSON, timeout


@click.command()
@apply(TEXT_OR_JSON, timeout(10.0))
@pass_invocation
def tables(invocation: Invocation, format: str, timeout: float) -> int:
    """Every table with its columns, types and what each column means."""
    write_tables(describe_tables(invocation.target(), timeout), format)
    return ExitCode.OK
