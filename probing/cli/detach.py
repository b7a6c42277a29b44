"""`probing PID detach`: stop the agent; the job runs on."""

from __future__ import annotations

import click

from ..engine.requests import detach
from ..errors import ExitCode
from .invocation import Invocation
from .options import apply, pass_invocation
from .render.reports import write_detached
from .spec import timeout


@click.command(name="detach")
@apply(timeout(5.0))
@pass_invocation
def detach_command(invocation: Invocation, timeout: float) -> int:
    """Stop the agent: its threads, hooks and socket go; the job runs on."""
    write_detached(detach(invocation.kind().process(), timeout))
    return ExitCode.OK
