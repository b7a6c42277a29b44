"""What `probing PID listen` did: where each agent listens on TCP, and whether it is registered
in the job's store (how other nodes find it)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Dict

from . import inert
from .json_writer import write_json
from .per_rank import heading, write_json_answers, write_missing

if TYPE_CHECKING:
    from ...engine.jobs.fanout import Gathered
    from ...engine.jobs.job import Job
    from ...engine.listen import Listening


def listening_fields(listening: Listening) -> Dict[str, Any]:
    return dict(listening._asdict())


def listening_text(listening: Listening) -> str:
    verb = "already listens" if listening.already else "listens now"
    text = f"{verb} on {inert(listening.endpoint)}"
    if listening.registered:
        return text + ", registered in the job's store"
    if listening.registry_error:
        return text + f"; not registered in the job's store: {inert(listening.registry_error)}"
    return text + "; not registered in the job's store (yet: a process that is no torchrun rank never is)"


def write_listening(listening: Listening, format: str) -> None:
    if format == "json":
        write_json(listening_fields(listening))
        return
    sys.stdout.write(f"PID {listening.pid}: {listening_text(listening)}\n")
    sys.stdout.flush()


def write_job_listening(job: Job, gathered: Gathered, format: str) -> None:
    if format == "json":
        write_json_answers(job, gathered, listening_fields)
    else:
        for rank, listening in gathered.answers:
            sys.stdout.write(f"{heading([rank])}: {listening_text(listening)}\n")
        sys.stdout.flush()
    write_missing(gathered.missing)
