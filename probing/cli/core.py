"""`probing core CORE [backtrace | query SQL]`: the Python stacks in a core file, and SQL over
them. A core file is a target like any other (`probing CORE backtrace`, engine/kinds/core.py);
this spelling, pystack's, stays for --exe: the interpreter, when not the one the core names."""

from __future__ import annotations

from typing import Optional, Tuple

import click

from ..engine.kinds.core import Core
from ..errors import ExitCode, UsageError
from .invocation import Invocation, read_argument
from .options import apply, pass_invocation
from .render import log_to_stderr
from .render.core import write_core
from .render.rows import write_rows
from .spec import ROW_FORMATS, Option, timeout


@click.command(name="core")
@click.argument("core_file", metavar="CORE")
@click.argument("command", metavar="[backtrace | query SQL]", nargs=-1)
@click.option(
    "--exe", metavar="PATH", type=click.Path(),
    help="The Python interpreter that wrote the core, when the one the core names is not on this "
    "machine (another host, a container's image).",
)  # fmt: skip
@apply(
    Option("--locals", "each frame's local variables (bounded reprs)", flag=True, default=False),
    Option("--thread", "only the thread with this name or native id", metavar="NAME|ID"),
    Option(
        "--format",
        "text: the stacks read like a traceback (query: an aligned table); the others give rows",
        default="text",
        choices=("text", *ROW_FORMATS),
    ),
    timeout(60.0, "Seconds pystack may take to read the core."),
)
@pass_invocation
def core_command(
    invocation: Invocation, core_file: str, command: Tuple[str, ...], exe: Optional[str], locals: bool,
    thread: Optional[str], format: str, timeout: float,
) -> int:  # fmt: skip
    """The Python stacks in a core file (a crashed job's, or a gcore of a live one).

    \b
      probing core CORE                     every thread's stack, read like a traceback
      probing core CORE query "SQL"         DuckDB SQL over its python.backtrace
      probing core CORE --exe /usr/bin/python3.11 ...   the interpreter, if not the one it names

    Read with pystack, in a process of its own. Only the stacks outlive the process in a core;
    the other tables need a live process (or a record written by the agent).
    """
    sql = _sql(command)
    core = Core(core_file, "core", exe, log_to_stderr if invocation.verbose else None)
    if sql is None:
        answer = core.stacks(locals, thread, timeout, False, False, False)
        write_core(answer.value, format)
        return answer.exit_code
    rows = core.query(sql, timeout, 0.0, 0.0).value
    write_rows(rows.columns, rows.types, rows.rows, "table" if format == "text" else format)
    return ExitCode.OK


def _sql(command: Tuple[str, ...]) -> Optional[str]:
    """None for the stacks (no command, or `backtrace`); the query's text for `query SQL`."""
    if not command or command == ("backtrace",):
        return None
    if command[0] == "query" and len(command) == 2:
        return read_argument(command[1], "SQL")
    if command[0] == "query":
        raise UsageError('query takes one SQL argument: probing core CORE query "SELECT ..."')
    raise UsageError(f"{' '.join(command)!r}: probing core CORE [backtrace | query SQL]")
