"""`probing PID ranks`: the job, then one row per rank (its place, its PID, whether an agent
listens, what its main thread is doing). For people a header and a table; for scripts the
same rows as table/csv/jsonl, or one JSON document with the job and its ranks."""

from __future__ import annotations

import os
import sys
from typing import IO, TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import inert, notes
from .json_writer import write_json
from .per_rank import job_fields
from .rows import write_rows, write_table

if TYPE_CHECKING:
    from ...engine.jobs.glance import JobGlance, RankGlance
    from ...engine.jobs.job import Job

# The rows' columns (and the keys of each rank in JSON), documented in docs/commands.md.
# host: the node's hostname; pid: on that node; endpoint: where its agent listens on TCP. The two
# newest at the end, where scripts reading the older columns by position do not see them.
# listen_error: why an agent asked to listen (PROBING_LISTEN) does not.
COLUMNS = ("rank", "local_rank", "node", "pid", "agent", "source", "state", "error", "host", "endpoint",
           "listen_error")  # fmt: skip
TYPES = ("INTEGER", "INTEGER", "INTEGER", "BIGINT", "BOOLEAN", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR",
         "VARCHAR", "VARCHAR")  # fmt: skip
# What people read: the error takes the place of the state it kept from being read. host and
# endpoint only for a job whose agents listen on TCP or that spans nodes.
TEXT_COLUMNS = ("rank", "local_rank", "node", "pid", "agent", "source", "state")
TEXT_TYPES = ("INTEGER", "INTEGER", "INTEGER", "BIGINT", "BOOLEAN", "VARCHAR", "VARCHAR")
NETWORK_COLUMNS = ("rank", "local_rank", "node", "host", "pid", "endpoint", "agent", "source", "state")
NETWORK_TYPES = (
    "INTEGER",
    "INTEGER",
    "INTEGER",
    "VARCHAR",
    "BIGINT",
    "VARCHAR",
    "BOOLEAN",
    "VARCHAR",
    "VARCHAR",
)


def _host(each: RankGlance) -> Optional[str]:
    rank = each.rank
    if rank.remote or rank.unreachable is not None:
        return rank.host
    return rank.host or os.uname().nodename


def _row(each: RankGlance) -> Tuple[Any, ...]:
    rank = each.rank
    error = each.error.message if each.error is not None else None
    pid = rank.pid or None  # 0: a rank of this node whose process is gone
    return (rank.rank, rank.local_rank, rank.node, pid, each.agent, each.source, each.state, error,
            _host(each), each.endpoint, each.listen_error)  # fmt: skip


def _job_object(job: Job) -> Dict[str, Any]:
    return dict(
        job_fields(job),
        ranks_here=len(job.ranks),
        ranks_gone=[rank.rank for rank in job.absent],
        ranks_remote=[rank.rank for rank in job.remote if rank.unreachable is None],
        ranks_unreachable=[rank.rank for rank in job.remote if rank.unreachable is not None],
    )


def _text(answer: JobGlance, out: IO[str]) -> None:
    job = answer.job
    count = len(job.ranks)
    reached = sum(1 for rank in job.remote if rank.unreachable is None)
    unreachable = len(job.remote) - reached
    here = (
        f"{count} rank{'' if count == 1 else 's'} on this machine"
        + (f", {len(job.absent)} gone" if job.absent else "")
        + (f", {reached} on other nodes" if reached else "")
        + (f", {unreachable} unreachable" if unreachable else "")
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
        rows.append((rank.rank, rank.local_rank, rank.node, _host(each) or "-", pid, each.endpoint or "-",
                     each.agent, each.source or "-", state))  # fmt: skip
    if any(each.endpoint or each.rank.remote or each.rank.unreachable for each in answer.ranks):
        write_table(NETWORK_COLUMNS, NETWORK_TYPES, rows, out)  # every cell made inert
    else:
        write_table(TEXT_COLUMNS, TEXT_TYPES, [row[:3] + row[4:5] + row[6:] for row in rows], out)
    # PROBING_LISTEN asked for a listener that did not start (no token, port in use): the agent
    # writes nothing to the job's output, so this is where a user learns why.
    notes(
        f"rank {each.rank.rank}: its agent does not listen on TCP: {each.listen_error}"
        for each in answer.ranks
        if each.listen_error
    )


def write_job_glance(answer: JobGlance, format: str) -> None:
    out = sys.stdout
    if format == "text":
        _text(answer, out)
    elif format == "json":
        ranks = [dict(zip(COLUMNS, _row(each))) for each in answer.ranks]
        write_json({"job": _job_object(answer.job), "ranks": ranks}, out)
    else:
        write_rows(COLUMNS, TYPES, [_row(each) for each in answer.ranks], format, out)
