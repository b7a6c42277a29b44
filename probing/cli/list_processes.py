"""`probing list`: the Python processes this user can see, and which have an agent."""

from __future__ import annotations

import click

from ..engine.listing import python_processes
from ..errors import ExitCode
from .options import apply
from .render.rows import write_rows
from .spec import ROWS_FORMAT


@click.command(name="list")
@apply(ROWS_FORMAT)
def list_command(format: str) -> int:
    """Python processes you can see, and whether each has an agent."""
    columns = ["pid", "user", "python", "agent", "command"]
    types = ["BIGINT", "VARCHAR", "VARCHAR", "BOOLEAN", "VARCHAR"]
    rows = [(p.pid, p.user, p.python_version, p.agent, p.command) for p in python_processes()]
    write_rows(columns, types, rows, format)
    return ExitCode.OK
