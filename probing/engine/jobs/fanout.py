"""Many ranks at once: one thread per rank, each doing what a command does for one target, so
that `--ranks all` costs about one rank's time and one slow or dead rank never holds the others.

Each rank's work carries its own timeouts (the same as for one target); `gather` also stops
waiting at an overall deadline, names the ranks that have not answered by then, and leaves
their threads behind (daemons: Python cannot stop a thread, and the process exits after the
answer anyway).
"""

from __future__ import annotations

import time

from ...errors import AgentTimeout, AgentUnreachable, ExitCode, ProbingError, ProcessNotFound

# No typing at run time: `probing PID backtrace --ranks all` starts through here (cli/fast.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from .job import Rank


class Missing:
    """A rank that gave no answer, and why."""

    __slots__ = ("rank", "error")

    def __init__(self, rank: Rank, error: ProbingError) -> None:
        self.rank = rank
        self.error = error


class Gathered:
    """What the ranks answered, (rank, answer) by rank, and the ranks that did not."""

    __slots__ = ("answers", "missing")

    def __init__(self, answers: List[Tuple[Rank, Any]], missing: List[Missing]) -> None:
        self.answers = answers
        self.missing = missing

    def exit_code(self) -> int:
        """OK when every rank answered; PARTIAL when some did; the first failure's own code
        when none did (every rank without an agent, say, is exit 6 as for one process)."""
        if not self.missing:
            return ExitCode.OK
        if self.answers:
            return ExitCode.PARTIAL
        return self.missing[0].error.exit_code


class _Outcome:
    __slots__ = ("answer", "error", "crash", "done")

    def __init__(self, done: threading.Event) -> None:
        self.answer: Optional[object] = None
        self.error: Optional[ProbingError] = None
        self.crash: Optional[BaseException] = None  # a bug, raised again in the caller's thread
        self.done = done


def _expect_relayed(ranks: List[Rank]) -> None:
    """Each node relay (relayed.py) learns how many of its ranks are about to ask."""
    counts: Dict[int, Tuple[Any, int]] = {}
    for rank in ranks:
        if rank.relay is not None and rank.unreachable is None and rank.pid:
            relay, count = counts.get(id(rank.relay), (rank.relay, 0))
            counts[id(rank.relay)] = (relay, count + 1)
    for relay, count in counts.values():
        relay.expect(count)


def _enough_descriptors(ranks: int) -> None:
    """Raise this process's soft limit on open files toward its hard limit when a connection
    per rank (PROBING_RELAY=0, or ranks a relay could not reach) could pass it: the default soft
    limit, 1 024, is what a thousand ranks and their replies take."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * ranks + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if raised > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))


def gather(ranks: List[Rank], work: Callable[[Rank], Any], deadline_s: float) -> Gathered:
    """`work(rank)` for every rank in parallel; what each answered by the deadline."""
    import threading  # not at import: `backtrace --ranks all` of a healthy job needs no thread

    if len(ranks) > 256:
        _enough_descriptors(len(ranks))
    outcomes: Dict[int, _Outcome] = {}
    _expect_relayed(ranks)

    def run(rank: Rank, outcome: _Outcome) -> None:
        try:
            outcome.answer = work(rank)
        except ProbingError as error:
            outcome.error = error
        except BaseException as crash:  # noqa: BLE001 - handed to the caller's thread
            outcome.crash = crash
        finally:
            outcome.done.set()

    # Ranks asked through a relay first: their threads only wait for their node's batch, which
    # goes once the node's ranks have all asked; a local rank's thread works (decodes, reads
    # /proc) and would hold the starting of the rest.
    for rank in sorted(ranks, key=lambda each: each.relay is None):
        outcome = outcomes[rank.rank] = _Outcome(threading.Event())
        if rank.unreachable is not None:
            outcome.error = AgentUnreachable(rank.unreachable)
            outcome.done.set()
            continue
        if rank.pid == 0:
            outcome.error = ProcessNotFound(
                "not running: no process of the job has it on this machine (it exited or was killed)"
            )
            outcome.done.set()
            continue
        thread = threading.Thread(target=run, args=(rank, outcome), name=f"probing-rank-{rank.rank}")
        thread.daemon = True
        thread.start()
    end = time.monotonic() + deadline_s
    answers: List[Tuple[Rank, Any]] = []
    missing: List[Missing] = []
    for rank in ranks:
        outcome = outcomes[rank.rank]
        if not outcome.done.wait(max(0.0, end - time.monotonic())):
            # Said of the rank under its heading (render/per_rank.py): the same words for every
            # late rank, which is one line for a node that froze.
            missing.append(Missing(rank, AgentTimeout(f"no answer within {deadline_s:g} s")))
        elif outcome.crash is not None:
            raise outcome.crash
        elif outcome.error is not None:
            missing.append(Missing(rank, outcome.error))
        else:
            answers.append((rank, outcome.answer))
    return Gathered(answers, missing)
