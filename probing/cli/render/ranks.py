"""`probing PID ranks`: the job, then one row per rank (its place, its PID, whether an agent
listens, what its main thread is doing). For people a header and a table; for scripts the
same rows as table/csv/jsonl, or one JSON document with the job and its ranks."""

from __future__ import annotations

import sys

from . import inert
from .json_writer import write_json
from .per_rank import job_fields
from .rows import write_rows, write_table

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any, Dict, List, Optional, Tuple

    from ...engine.job import Job
    from ...engine.job_glance import JobGlance, RankGlance

# The rows' columns (and the keys of each rank in JSON), documented in docs/commands.md.
COLUMNS = ("rank", "local_rank", "node", "pid", "agent", "source", "state", "error")
TYPES = ("INTEGER", "INTEGER", "INTEGER", "BIGINT", "BOOLEAN", "VARCHAR", "VARCHAR", "VARCHAR")
# What people read: the error takes the place of the state it kept from being read.
TEXT_COLUMNS = ("rank", "local_rank", "node", "pid", "agent", "source", "state")


def _row(each: RankGlance) -> Tuple[Any, ...]:
    rank = each.rank
    error = each.error.message if each.error is not None else None
    pid = rank.pid or None  # 0: a rank of this node whose process is gone
    return (rank.rank, rank.local_rank, rank.node, pid, each.agent, each.source, each.state, error)


def _job_object(job: Job) -> Dict[str, Any]:
    return dict(job_fields(job), ranks_here=len(job.ranks), ranks_gone=[rank.rank for rank in job.absent])


def _text(answer: JobGlance, out: IO[str]) -> None:
    job = answer.job
    count = len(job.ranks)
    here = f"{count} rank{'' if count == 1 else 's'} on this machine" + (
        f", {len(job.absent)} gone" if job.absent else ""
    )
    out.write(f"Job: {inert(job.name())}; world size {job.world_size}, {here}\n\n")
    rows: List[Tuple[Any, ...]] = []
    for each in answer.ranks:
        rank = each.rank
        state: Optional[str] = each.state
        if each.error is not None:
            state = f"could not look: {each.error.message}"
        # `-` rather than NULL where nothing was read (the state says why) or the process is gone.
        pid = rank.pid or "-"
        rows.append((rank.rank, rank.local_rank, rank.node, pid, each.agent, each.source or "-", state))
    write_table(TEXT_COLUMNS, TYPES[: len(TEXT_COLUMNS)], rows, out)  # every cell made inert


def write_job_glance(answer: JobGlance, format: str) -> None:
    out = sys.stdout
    if format == "text":
        _text(answer, out)
    elif format == "json":
        ranks = [dict(zip(COLUMNS, _row(each))) for each in answer.ranks]
        write_json({"job": _job_object(answer.job), "ranks": ranks}, out)
    else:
        write_rows(COLUMNS, TYPES, [_row(each) for each in answer.ranks], format, out)
