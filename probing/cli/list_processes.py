"""`probing list`: the Python processes this user can see, which have an agent, and their jobs."""

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
    """Python processes you can see, whether each has an agent, and the distributed job and
    rank each belongs to (a job's processes listed together, in rank order). probing's own
    processes are left out; on a terminal, command lines are cut to its width."""
    columns = ["pid", "user", "python", "agent", "job", "rank", "local_rank", "command"]
    types = ["BIGINT", "VARCHAR", "VARCHAR", "BOOLEAN", "VARCHAR", "INTEGER", "INTEGER", "VARCHAR"]
    # Whether another user's job has an agent may be past knowing (engine/listing.py agent_state):
    # people read `unknown` there, scripts a null.
    unknown = "unknown" if format == "table" else None
    rows = [
        (p.pid, p.user, p.python_version, unknown if p.agent is None else p.agent, p.job, p.rank,
         p.local_rank, p.command)
        for p in python_processes()
    ]  # fmt: skip
    write_rows(columns, types, rows, format, fit_terminal=True)
    return ExitCode.OK
