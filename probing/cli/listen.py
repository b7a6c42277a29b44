"""`probing PID listen`: the agent listens on TCP and registers its endpoint in the job's store."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.kinds import Ranks
from ..engine.listen import start_listening
from .invocation import Invocation
from .options import apply, pass_invocation
from .render.listen import write_job_listening, write_listening
from .spec import TEXT_OR_JSON, Option, timeout

ADDRESS = Option(
    "--address",
    "[HOST:]PORT to listen on, or auto (every address, a free port); a fixed PORT is PORT + LOCAL_RANK "
    "in a rank of a job",
    default="auto",
    metavar="ADDR",
)
LISTEN_RANKS = Option(
    "--ranks",
    "every rank of this node's part of the job (local), or as for other commands (all, 0,2-3): "
    "ranks on other nodes only say where they listen",
    metavar="local|all|LIST",
)


@click.command(name="listen")
@apply(ADDRESS, LISTEN_RANKS, TEXT_OR_JSON, timeout(5.0))
@pass_invocation
def listen_command(
    invocation: Invocation, address: str, ranks: Optional[str], format: str, timeout: float
) -> int:
    """Listen on TCP for the CLIs of other nodes (authenticated by the job's token).

    The CLI's token (PROBING_TOKEN, PROBING_TOKEN_FILE or ~/.probing/token) is handed to the agent
    over its Unix socket; the agent registers its endpoint in the job's rendezvous store, where
    `--ranks` on any node finds it. A process without an agent is attached to first.
    """
    answer = invocation.kind(ranks).each(
        lambda target: start_listening(target, address, timeout), timeout + 1.0
    )
    if isinstance(answer, Ranks):
        write_job_listening(answer.job, answer.gathered, format)
    else:
        write_listening(answer.value, format)
    return answer.exit_code
