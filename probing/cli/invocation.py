"""What the global options say (the target, -v, --no-attach, --attach-timeout), and how a
command gets its engine Target from them. Click-free: the fast path uses it too."""

from __future__ import annotations

import sys

from ..engine.record_path import is_record_path
from ..engine.target import Target, quiet
from ..errors import NotLive, UsageError
from .render import log_to_stderr, notes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Tuple

    from ..engine.job import Job, Rank
    from ..engine.record import Record


# What each agent asked while the job is found (its registry, or its hello) may take.
REGISTRY_TIMEOUT_S = 5.0


class Invocation:
    __slots__ = ("target_text", "verbose", "no_attach", "attach_timeout", "endpoints", "command")

    def __init__(
        self,
        target_text: Optional[str],
        verbose: bool,
        no_attach: bool = False,
        attach_timeout: float = 5.0,
        endpoints: Optional[str] = None,
    ) -> None:
        self.target_text = target_text
        self.endpoints = endpoints  # --endpoints: the job's agents over TCP, instead of a TARGET
        self.verbose = verbose
        self.no_attach = no_attach
        self.attach_timeout = attach_timeout
        self.command: Optional[str] = None  # the command's name, for messages (set by click)

    def is_record(self) -> bool:
        return self.target_text is not None and is_record_path(self.target_text)

    def record(self) -> Optional[Record]:
        """The record file TARGET names, read (BadRecord if it cannot be); None for a process."""
        if not self.is_record():
            return None
        from ..engine.record import open_record

        return open_record(self.target_text or "")

    def live_only(self, what: Optional[str] = None) -> NotLive:
        """The error for `what` (the command by default) asked of a record."""
        what = what or (f"`{self.command}`" if self.command else "this command")
        return NotLive(f"{what} needs a live process: {self.target_text} is a record of a job that has ended")

    def target(self) -> Target:
        """The engine's view of the target; a malformed TARGET is a UsageError, a record file
        NotLive (what asks for a Target needs a process)."""
        if self.is_record():
            raise self.live_only()
        log = log_to_stderr if self.verbose else None
        return Target(self.target_text, log, self.no_attach, self.attach_timeout)

    def job(self, ranks: str) -> Tuple[Job, List[Rank]]:
        """--ranks: the job the target belongs to, and the ranks chosen of it."""
        from ..client.discovery import require_process
        from ..engine.job import choose, find_job

        log = log_to_stderr if self.verbose else quiet
        if self.endpoints is not None:
            from ..engine.job_remote import job_from_endpoints, parse_endpoints

            if self.target_text is not None:
                raise UsageError("give either a TARGET or --endpoints, not both")
            job = job_from_endpoints(parse_endpoints(self.endpoints), REGISTRY_TIMEOUT_S, log)
            notes(job.notes)
            return job, choose(job, ranks)
        pid = self.target().require_pid("--ranks")
        require_process(pid)
        job = find_job(pid)
        if job.world_size > len(job.ranks) + len(job.absent):
            from ..engine.job_remote import with_remote_ranks

            job = with_remote_ranks(job, REGISTRY_TIMEOUT_S, log)
            notes(job.notes)
        return job, choose(job, ranks)

    def local_job(self) -> Tuple[Job, List[Rank]]:
        """The job the target belongs to and its ranks on this node only (no other node asked)."""
        from ..client.discovery import require_process
        from ..engine.job import find_job

        pid = self.target().require_pid("--ranks local")
        require_process(pid)
        job = find_job(pid)
        return job, list(job.ranks)

    def rank_target(self, rank: Rank) -> Target:
        """One rank of the job, with the global options; -v lines name the rank."""

        def log(message: str) -> None:
            log_to_stderr(f"rank {rank.rank}: {message}")

        text = f"tcp://{rank.endpoint}" if rank.remote else str(rank.pid)
        expected = rank if rank.remote else None  # what answers over TCP must say it is this rank
        return Target(text, log if self.verbose else None, self.no_attach, self.attach_timeout, expected)


def read_argument(value: str, what: str) -> str:
    """`-` means: read it from standard input (for code or SQL with quotes and newlines)."""
    text = sys.stdin.read() if value == "-" else value
    if not text.strip():
        raise UsageError(f"empty {what}")
    return text
