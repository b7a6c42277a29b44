"""`probing run -- CMD`: start CMD with the agent in every Python process it starts, and with
--hang-timeout, end it (exit 11) with every stack when it stops progressing."""

from __future__ import annotations

from typing import List, Optional, Tuple

import click

from ..engine.listen import cli_token
from ..errors import UsageError
from ..launch.launcher import Launcher
from ..launch.watchdog import HungJob, Watchdog
from ..protocol.endpoints import LISTEN_FORMS, AddressError, parse_listen_address
from .invocation import Invocation
from .options import carrier_threads, pass_invocation
from .render import log_to_closable_stderr, stderr_is_closed
from .render.files import check_output
from .render.reports import write_hung_job, write_started

LISTEN_HINT = (
    f"--listen takes {LISTEN_FORMS}; its ADDR is optional, so put `--` before the command: "
    "probing run --listen -- python train.py"
)


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--hang-timeout", type=click.FloatRange(min=0, min_open=True), metavar="S",
    help="CI watchdog: if no thread that carries the job (as `hang` says it) moves or uses the CPU for "
    "S seconds, print every stack of the process tree, end the tree and exit 11.",
)  # fmt: skip
@click.option(
    "--report", type=click.Path(dir_okay=False), metavar="FILE", help="With --hang-timeout: a JSON report."
)
@click.option(
    "--listen", is_flag=False, flag_value="auto", default=None, metavar="[ADDR]",
    help="Every agent of the job listens on TCP ([HOST:]PORT, default auto) for the CLIs of other "
    "nodes; needs the token (PROBING_TOKEN, or ~/.probing/token) here and in the job.",
)  # fmt: skip
@carrier_threads
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@pass_invocation
def run(
    invocation: Invocation,
    hang_timeout: Optional[float],
    report: Optional[str],
    listen: Optional[str],
    carriers: Tuple[str, ...],
    command: List[str],
) -> int:
    """Run COMMAND with the agent in every Python process it starts.

    Prints the child's PID on stderr, forwards signals, exits with the child's status.
    """
    if report is not None and hang_timeout is None:
        raise click.UsageError("--report goes with --hang-timeout")
    if carriers and hang_timeout is None:
        raise click.UsageError("--thread goes with --hang-timeout")
    if not command:
        raise UsageError("nothing to run: probing run -- python train.py")
    if listen is not None:
        try:
            parse_listen_address(listen)
        except AddressError as error:
            raise UsageError(f"--listen: {error}", hint=LISTEN_HINT) from None
        cli_token()  # the job's agents would refuse to listen without one: say so before it starts
    if report is not None:
        check_output(report)  # a report nowhere to be written is said now, not once the job hangs
    launcher = Launcher(list(command), listen=listen)
    child = launcher.start()
    # The job runs on, and its watchdog with it, whoever still reads our stderr.
    try:
        write_started(child.pid, list(command))
    except BrokenPipeError:
        stderr_is_closed()
    if hang_timeout is None:
        return launcher.wait()

    def on_hung(job: HungJob) -> None:
        try:
            write_hung_job(job, report)
        except BrokenPipeError:  # `probing run ... 2>&1 | head`: the job is ended all the same, exit 11
            stderr_is_closed()

    log = log_to_closable_stderr if invocation.verbose else None
    watchdog = Watchdog(child.pid, hang_timeout, on_hung, log, carriers)
    return launcher.wait(watchdog.tick, watchdog.interval)
