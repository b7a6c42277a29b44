"""`probing PID eval CODE`: run Python in the process; what it prints, then its value."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.requests import evaluate
from ..errors import ExitCode
from .invocation import Invocation, read_argument
from .options import apply, pass_invocation
from .render.reports import write_eval_result
from .spec import timeout


@click.command(name="eval")
@click.argument("code")
@click.option(
    "--frame", metavar="THREAD:FUNCTION",
    help="Run with that frame's locals over its globals (e.g. MainThread:train).",
)  # fmt: skip
@apply(timeout(10.0, "Seconds the code may run; then it is interrupted."))
@click.option(
    "--force", is_flag=True,
    help="Let the code end the process (os._exit, os.abort, os.kill of itself, exec), refused otherwise.",
)  # fmt: skip
@pass_invocation
def eval_command(invocation: Invocation, code: str, frame: Optional[str], timeout: float, force: bool) -> int:
    """Run CODE in the process's __main__ namespace ('-' reads it from stdin).

    What the code prints comes back; a final expression's value is shown as the REPL would.
    """
    source = read_argument(code, "code")
    write_eval_result(evaluate(invocation.target(), source, frame, timeout, force))
    return ExitCode.OK
