"""`probing records`: the records jobs left on this machine, newest first."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.records.listing import list_pruned, list_records, record_directories
from ..errors import ExitCode
from .options import apply
from .render.record import write_records
from .spec import TEXT_OR_JSON


@click.command()
@click.option(
    "--dir", "directory", metavar="DIR",
    help="Look in DIR. Default: PROBING_RECORD_DIR, else <socket dir>/records (PROBING_SOCKET_DIR or "
    "/tmp/probing-UID); as root, every user's /tmp/probing-*/records too.",
)  # fmt: skip
@apply(TEXT_OR_JSON)
def records(directory: Optional[str], format: str) -> int:
    """The records on this machine, newest first: when, PID, rank, command, why it ended, size, path.

    A record is a target: `probing FILE backtrace|query|tables|memory|hang|export`. A fatal-signal
    file (.fatal) is listed once its process is gone: with the stacks faulthandler wrote, or as
    "ended without a trace" when the job died without one (SIGKILL, os._exit, or a fault handler of
    its own). Then the records agents removed lately to keep the directory within its bounds
    (PROBING_RECORD_KEEP newest per job, PROBING_RECORD_TOTAL_FILES and PROBING_RECORD_TOTAL_MB
    per directory), each with why.
    """
    directories = [directory] if directory is not None else record_directories()
    given = directory is not None
    write_records(list_records(directories, given), format, directories, list_pruned(directories, given))
    return ExitCode.OK
