"""A job of ranks (`--ranks`, or `--endpoints`): the ranks chosen of the torchrun job a process
belongs to, on this node and the others; each asked at once, one thread per rank (fanout.py),
so that the job answers in about its slowest rank's time.
"""

from __future__ import annotations

from ...errors import ExitCode
from ..jobs.fanout import Gathered
from .base import Kind, Ranks, Rows

# No typing at run time, and each operation's engine loaded when asked: `probing PID backtrace
# --ranks all` starts through here (cli/fast.py; CONTRIBUTING.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, List, Optional, Sequence

    from ..jobs.job import Job as JobOfRanks
    from ..jobs.job import Rank
    from ..target import Target
    from . import Options

# What each agent asked while the job is found (its registry, or its hello) may take.
REGISTRY_TIMEOUT_S = 5.0


class Job(Kind):
    described = "a job"

    def __init__(
        self, text: str, command: str, job: JobOfRanks, chosen: List[Rank], options: Options, ranks: str
    ) -> None:
        super().__init__(text, command)
        self.job = job
        self.chosen = chosen
        self.options = options
        self.attach_timeout = options.attach_timeout
        self.source = f"{text or 'job'} --ranks {ranks}"
        if any(rank.remote for rank in chosen):
            from ..jobs.relayed import assign_relays

            assign_relays(chosen, options.log)

    def rank_target(self, rank: Rank) -> Target:
        """One rank of the job, with the global options; -v lines name the rank."""
        from ..target import Target

        log = self.options.log

        def rank_log(message: str) -> None:
            log(f"rank {rank.rank}: {message}")

        text = f"tcp://{rank.endpoint}" if rank.remote else str(rank.pid)
        expected = rank if rank.remote else None  # what answers over TCP must say it is this rank
        log_of_rank = rank_log if self.options.verbose else None
        return Target(text, log_of_rank, self.options.no_attach, self.attach_timeout, expected)

    def each(self, work: Callable[[Target], Any], extra_s: float) -> Ranks:
        from ..jobs.fanout import gather

        deadline = self.attach_timeout + extra_s
        gathered = gather(self.chosen, lambda rank: work(self.rank_target(rank)), deadline)
        return Ranks(self.job, gathered)

    def stacks(
        self, locals: bool, thread: Optional[str], timeout: float, native: bool, children: bool,
        attach_children: bool,
    ) -> Ranks:  # fmt: skip
        from ...errors import UsageError
        from ..backtrace import read_stacks_of_ranks, stacks_deadline

        if children or attach_children:
            raise UsageError("--ranks reads every rank already; --children does not go with it")
        deadline = stacks_deadline(timeout, self.attach_timeout)
        gathered = read_stacks_of_ranks(
            self.chosen, self.rank_target, locals, thread, timeout, deadline, native
        )
        return Ranks(self.job, gathered)

    def query(self, sql: str, timeout: float, scan_budget: float, step_wait: float) -> Ranks:
        from ..query import load_job_tables

        tables = load_job_tables(
            self.chosen, self.rank_target, sql, timeout, self.attach_timeout, scan_budget, step_wait
        )
        gathered = Gathered([], tables.missing)
        if not tables.session.tables or len(tables.missing) == len(self.chosen):
            # Nothing to run the SQL over: why each rank gave nothing is the answer.
            code = tables.missing[0].error.exit_code if tables.missing else ExitCode.OK
            return Ranks(self.job, gathered, Rows(None, None, None, tables.notes), code)
        result = tables.session.run(sql)
        rows = Rows(result.columns, result.types, result.rows, tables.notes)
        return Ranks(self.job, gathered, rows, ExitCode.PARTIAL if tables.missing else ExitCode.OK)

    def describe(self, timeout: float) -> Ranks:
        from ..query import describe_tables

        return self.each(lambda target: describe_tables(target, timeout), timeout + 1.0)

    def hang(self, duration: float, samples: int, timeout: float, carriers: Sequence[str]) -> Ranks:
        from ..jobs.hang import watch_job

        watched = watch_job(
            self.chosen, self.rank_target, duration, samples, timeout, self.attach_timeout, carriers
        )
        if watched.verdict.hung:
            code = ExitCode.HUNG
        elif watched.failure_code is not None:
            code = watched.failure_code
        else:
            code = ExitCode.PARTIAL if watched.verdict.missing else ExitCode.OK
        answer = Ranks(self.job, None, watched.verdict, code)
        answer.notes = list(watched.notes)
        return answer

    def stragglers(self, duration: float, timeout: float) -> Ranks:
        from ..jobs.stragglers import watch_job as watch_for_stragglers

        watched = watch_for_stragglers(self.chosen, self.rank_target, duration, timeout, self.attach_timeout)
        verdict = watched.verdict
        if verdict.stuck is not None:
            code = ExitCode.HUNG
        elif verdict.stragglers:
            code = ExitCode.STRAGGLER
        elif watched.failure_code is not None:
            code = watched.failure_code
        else:
            code = ExitCode.PARTIAL if verdict.missing else ExitCode.OK
        answer = Ranks(self.job, None, verdict, code)
        answer.notes = list(watched.notes)
        return answer

    def memory(
        self, growth: Optional[float], cuda_snapshot: bool, interval: Optional[float], top: int,
        timeout: float, scan_budget: float, live_options: Sequence[str],
    ) -> Ranks:  # fmt: skip
        from ..requests import memory

        window = (growth or 0.0) + 2 * scan_budget
        return self.each(
            lambda target: memory(target, growth, False, interval, top, timeout, scan_budget),
            timeout + window + 1.0,
        )

    def report(self, timeout: float, hang_duration: float, hang_samples: int, tensors: bool) -> Ranks:
        from ..report.job import gather_job

        gathered = gather_job(self.job, self.chosen, self.rank_target, timeout, self.attach_timeout,
                              hang_duration, hang_samples)  # fmt: skip
        missing = Gathered([], gathered.missing)
        return Ranks(self.job, missing, gathered, ExitCode.PARTIAL if gathered.missing else ExitCode.OK)

    def glance(self, timeout: float) -> Ranks:
        """`ranks`: each rank's state at a glance."""
        from ..jobs.glance import glance_at_job

        answer = glance_at_job(self.job, self.chosen, self.rank_target, timeout)
        return Ranks(self.job, None, answer, answer.exit_code)

    def top(self, timeout: float) -> Any:
        from ..top import JobWatch

        return JobWatch(self.job, self.chosen, self.rank_target, timeout, self.attach_timeout)

    def timeline(self, steps: Any, timeout: float) -> Ranks:
        from ..timeline import job_timeline

        rows = job_timeline(self.chosen, self.rank_target, steps, timeout, self.attach_timeout)
        return Ranks(self.job, None, rows, ExitCode.OK)

    def module_flame(self, steps: Optional[str], timeout: float) -> Ranks:
        from ..flames.modules import torch_flame_of_target

        return self._flame(lambda target: torch_flame_of_target(target, steps, timeout), 0.0, timeout)

    def sampled_flame(self, duration: float, rate: float, timeout: float, outside: bool) -> Ranks:
        from ..flames.sampled import sample_stacks

        def one(target: Target) -> Any:
            return sample_stacks(target, duration, rate, timeout, outside)

        return self._flame(one, duration, timeout)

    def _flame(self, one: Callable[[Target], Any], window: float, timeout: float) -> Ranks:
        from ..flames.ranks import job_flame, sampling_deadline

        deadline = sampling_deadline(window, timeout, self.attach_timeout)
        picture, gathered = job_flame(self.chosen, self.rank_target, one, deadline)
        return Ranks(self.job, gathered, picture, ExitCode.PARTIAL if gathered.missing else ExitCode.OK)


def find(text: Optional[str], endpoints: Optional[str], ranks: str, options: Options, command: str) -> Job:
    """The job TARGET belongs to (or the one --endpoints name), and the ranks `ranks` chooses of
    it: `local`, this node's part only (no other node asked)."""
    from ...client.discovery import require_process
    from ...errors import UsageError
    from ..jobs.job import choose, find_job
    from ..target import Target

    if endpoints is not None:
        from ..jobs.remote import job_from_endpoints, parse_endpoints

        if text is not None:
            raise UsageError("give either a TARGET or --endpoints, not both")
        job = job_from_endpoints(parse_endpoints(endpoints), REGISTRY_TIMEOUT_S, options.log)
        found = Job("", command, job, choose(job, ranks), options, ranks)
        found.notes = list(job.notes)
        return found
    option = "--ranks local" if ranks == "local" else "--ranks"
    pid = Target(text, None, options.no_attach, options.attach_timeout).require_pid(option)
    require_process(pid)
    job = find_job(pid)
    if ranks == "local":
        return Job(text or "", command, job, list(job.ranks), options, ranks)
    if job.world_size > len(job.ranks) + len(job.absent):
        from ..jobs.remote import with_remote_ranks

        job = with_remote_ranks(job, REGISTRY_TIMEOUT_S, options.log)
        found = Job(text or "", command, job, choose(job, ranks), options, ranks)
        found.notes = list(job.notes)  # what the other nodes' registry said
        return found
    return Job(text or "", command, job, choose(job, ranks), options, ranks)
