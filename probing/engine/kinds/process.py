"""A live process: a PID, the path of its agent's socket, or a remote agent's tcp://HOST:PORT.

Everything a command asks is asked of its agent (attached first where it has none), or read from
outside where the agent cannot answer (engine/target.py holds how it is reached).
"""

from __future__ import annotations

from ...errors import ExitCode
from .base import Kind, One, Rows

# No typing at run time, and each operation's engine loaded when asked: `probing PID backtrace`
# starts through here (cli/fast.py; CONTRIBUTING.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, Sequence

    from ..target import Target


class Process(Kind):
    described = "a process"

    def __init__(self, target: Target, command: str) -> None:
        super().__init__(target.text or "", command)
        self.target = target

    def each(self, work: Callable[[Target], Any], extra_s: float) -> One:
        return One(work(self.target))

    def process(self) -> Target:
        return self.target

    def top(self, timeout: float) -> Any:
        from ..top import ProcessWatch

        return ProcessWatch(self.target, timeout)

    def stacks(
        self, locals: bool, thread: Optional[str], timeout: float, native: bool, children: bool,
        attach_children: bool,
    ) -> One:  # fmt: skip
        from ..backtrace import read_tree

        return One(read_tree(self.target, locals, thread, timeout, native, children, attach_children))

    def query(self, sql: str, timeout: float, scan_budget: float, step_wait: float) -> One:
        from ..query import load_tables

        loaded = load_tables(self.target, sql, timeout, scan_budget, step_wait)
        result = loaded.session.run(sql)
        return One(Rows(result.columns, result.types, result.rows, loaded.notes))

    def describe(self, timeout: float) -> One:
        from ..query import describe_tables

        return One(describe_tables(self.target, timeout))

    def hang(self, duration: float, samples: int, timeout: float, carriers: Sequence[str]) -> One:
        from ..hang import sample_hang
        from ..sources import SourceLines

        pid = None if self.target.remote else self.target.require_pid("hang")
        sources = SourceLines(pid)

        answer = sample_hang(self.target, duration, samples, timeout, sources.frame_line, carriers)
        return One(answer, ExitCode.HUNG if answer.report.hung else ExitCode.OK)

    def memory(
        self, growth: Optional[float], cuda_snapshot: bool, interval: Optional[float], top: int,
        timeout: float, scan_budget: float, live_options: Sequence[str],
    ) -> One:  # fmt: skip
        from ..requests import memory

        return One(memory(self.target, growth, cuda_snapshot, interval, top, timeout, scan_budget))

    def report(self, timeout: float, hang_duration: float, hang_samples: int, tensors: bool) -> One:
        from ..report.live import gather_live

        gathered = gather_live(self.target, timeout, hang_duration, hang_samples, tensors)
        return One(gathered, ExitCode.PARTIAL if gathered.failures else ExitCode.OK)

    def timeline(self, steps: Any, timeout: float) -> One:
        from ..timeline import live_timeline

        return One(live_timeline(self.target, steps, timeout))

    def module_flame(self, steps: Optional[str], timeout: float) -> One:
        from ..flames.modules import torch_flame_of_target

        return One(torch_flame_of_target(self.target, steps, timeout))

    def sampled_flame(self, duration: float, rate: float, timeout: float, outside: bool) -> One:
        from ..flames.sampled import sample_stacks

        return One(sample_stacks(self.target, duration, rate, timeout, outside))
