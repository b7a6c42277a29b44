"""`probing PID inject`: put the agent in now, and say how."""

from __future__ import annotations

import click

from ..engine.requests import inject
from ..errors import ExitCode
from .invocation import Invocation
from .options import apply, pass_invocation
from .render.reports import write_attach
from .spec import TEXT_OR_JSON


@click.command(name="inject")
@click.option(
    "--method", type=click.Choice(("auto", "ptrace", "gdb", "pyrasite")), default="auto", show_default=True,
    help="auto = ptrace; gdb stops every thread; pyrasite is unsafe (see docs/attach.md).",
)  # fmt: skip
@apply(TEXT_OR_JSON)
@pass_invocation
def inject_command(invocation: Invocation, method: str, format: str) -> int:
    """Put the agent into the process now; say how, and how long any thread was stopped."""
    target = invocation.kind().process()
    attached = inject(target, method)
    write_attach(target.require_pid("inject"), attached, format)
    return ExitCode.OK
