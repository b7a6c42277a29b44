"""`probing PID ranks`: every rank of the job PID belongs to, whether an agent listens in each,
and what each rank's main thread is doing now, from one look at its stacks.

The look goes through the rank's agent when one listens, and from outside (py-spy) otherwise:
this command never attaches, so it costs a job that planned nothing for probing no more than a
py-spy dump per rank. The ranks are looked at in parallel (engine/jobs/fanout.py): one slow or dead
rank costs its own row, never the others'.
"""

from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional

from ...analysis.glance import glance
from ...errors import ProbingError
from ..backtrace import read_stacks, stacks_deadline
from ..listing import agent_present
from ..sources import SourceLines
from ..target import Target
from .fanout import gather
from .job import Job, Rank

# Beyond what read_stacks itself may take (backtrace.stacks_deadline; nothing is attached here).
LOOK_GRACE_S = 1.0
# What of an agent's reason for not listening is shown (it comes from the job).
MAX_LISTEN_ERROR_CHARS = 1000


class RankGlance(NamedTuple):
    rank: Rank
    agent: bool  # an agent accepts connections on the rank's socket
    source: Optional[str]  # where its stacks came from: "agent" or "py-spy"; None if not read
    endpoint: Optional[str]  # where its agent listens on TCP ("HOST:PORT"), None where it does not
    state: Optional[str]  # its main thread at a glance (analysis/glance.py); None if not read
    error: Optional[ProbingError]  # why its stacks could not be read
    listen_error: Optional[str] = None  # why its agent, asked to listen (PROBING_LISTEN), does not


class JobGlance(NamedTuple):
    job: Job
    ranks: List[RankGlance]  # the ranks asked for, by rank
    exit_code: int  # OK; PARTIAL when some ranks could not be looked at (Gathered.exit_code)


class _Look(NamedTuple):
    source: Optional[str]
    state: str
    endpoint: Optional[str]  # the agent's listener, from its hello
    listen_error: Optional[str]  # why PROBING_LISTEN started no listener, from its hello


def _look(target: Target, timeout: float) -> _Look:
    stacks = read_stacks(target, False, None, timeout)
    sources = SourceLines(target.pid)
    state = glance(stacks.rows, sources.frame_line, stacks.info.get("outside"))
    source = stacks.rows[0].get("source") if stacks.rows else None
    listener = stacks.info.get("listener")
    endpoint = listener.get("endpoint") if isinstance(listener, dict) else None
    endpoint = endpoint if isinstance(endpoint, str) and len(endpoint) <= 256 else None
    why = stacks.info.get("listen_error")
    listen_error = why[:MAX_LISTEN_ERROR_CHARS] if isinstance(why, str) else None
    return _Look(source if isinstance(source, str) else None, state, endpoint, listen_error)


def glance_at_job(
    job: Job, chosen: List[Rank], target_of: Callable[[Rank], Target], timeout: float
) -> JobGlance:
    """A glance at each rank of `job` in `chosen`. `target_of(rank)`: the rank as a target,
    with the command's options (never attached to here, whatever they say); `timeout`: how
    long each rank's agent may take before its stacks are read from outside."""
    # A remote rank is known at all only because its agent listens (it registered).
    agents = {rank.rank: rank.remote or (rank.pid != 0 and agent_present(rank.pid)) for rank in chosen}

    def look(rank: Rank) -> _Look:
        target = target_of(rank)
        if rank.remote:
            return _look(target, timeout)
        # Never attach: a look at every rank must not put an agent into a job that has none.
        return _look(target.related(rank.pid, no_attach=True), timeout)

    gathered = gather(chosen, look, stacks_deadline(timeout, 0.0) + LOOK_GRACE_S)
    looked = {rank.rank: answer for rank, answer in gathered.answers}
    failed = {missing.rank.rank: missing.error for missing in gathered.missing}
    rows = []
    for rank in chosen:
        answer = looked.get(rank.rank)
        rows.append(
            RankGlance(
                rank,
                agents[rank.rank],
                answer.source if answer else None,
                rank.endpoint or (answer.endpoint if answer else None),
                answer.state if answer else None,
                failed.get(rank.rank),
                answer.listen_error if answer else None,
            )
        )
    return JobGlance(job, rows, gathered.exit_code())
