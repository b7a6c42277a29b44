"""`probing PID eval CODE`: run Python in the process; what it prints, then its value."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.kinds import Ranks
from ..engine.requests import EVAL_REPLY_GRACE_S, evaluate
from .invocation import Invocation, read_argument
from .options import apply, pass_invocation
from .render.per_rank import write_job_evals
from .render.reports import write_eval_result
from .spec import RANKS, timeout


@click.command(name="eval")
@click.argument("code")
@click.option(
    "--frame", metavar="THREAD:FUNCTION",
    help="Run over a copy of that frame's locals and its globals (e.g. MainThread:train); "
    "no other frame is searched.",
)  # fmt: skip
@apply(timeout(10.0, "Seconds the code may run; then it is interrupted."), RANKS)
@click.option(
    "--force", is_flag=True,
    help="Let the code end the process (os._exit, os.abort, os.kill of itself, exec), refused otherwise.",
)  # fmt: skip
@pass_invocation
def eval_command(
    invocation: Invocation, code: str, frame: Optional[str], timeout: float, ranks: Optional[str], force: bool
) -> int:
    """Run CODE in the process's __main__ namespace ('-' reads it from stdin).

    What the code prints comes back; a final expression's value is shown as the REPL would.
    A name __main__ lacks (`loss`, a local of the training function) is read from the job's
    frames, and stderr says which; several frames with different values: nothing runs, and the
    error lists the --frame that picks each.
    With --ranks, on every rank at once; the same output from several ranks is shown once.
    """
    source = read_argument(code, "code")
    answer = invocation.kind(ranks).each(
        lambda target: evaluate(target, source, frame, timeout, force), timeout + EVAL_REPLY_GRACE_S + 1.0
    )
    if isinstance(answer, Ranks):
        write_job_evals(answer.job, answer.gathered)
    else:
        write_eval_result(answer.value)
    return answer.exit_code
