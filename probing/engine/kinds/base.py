"""What every kind of target answers, and the answers' two shapes.

A command is written once against `Kind`: it asks for stacks, tables, a hang verdict, or hands
`each` the work it does on one live process, and renders what comes back. Each kind (a process,
a job of ranks, a record, a core file) overrides the operations it can answer; the others raise
NotLive (exit 16), naming the command and what the target is.

Standard library only, no typing at run time: `probing PID backtrace` starts through here
(cli/fast.py).
"""

from __future__ import annotations

from ...errors import ExitCode, NotLive
from ..jobs.fanout import Gathered

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, List, Optional, Sequence, Union

    from ..jobs.job import Job
    from ..target import Target

    Answer = Union["One", "Ranks"]


class One:
    """The answer of one process, record or core file."""

    __slots__ = ("value", "exit_code", "notes")

    def __init__(self, value: Any, exit_code: int = ExitCode.OK, notes: Sequence[str] = ()) -> None:
        self.value = value
        self.exit_code: int = exit_code
        self.notes = list(notes)


class Rows:
    """A query's answer: columns, their types, the rows, and the notes to say with them."""

    __slots__ = ("columns", "types", "rows", "notes")

    def __init__(self, columns: Any, types: Any, rows: Any, notes: Sequence[str] = ()) -> None:
        self.columns, self.types, self.rows = columns, types, rows
        self.notes = list(notes)


class Ranks:
    """The answers of the ranks of a job (`gathered`: by rank, and the ranks that gave none), or
    the one thing made of them (`value`: a verdict, a picture), with the exit code it comes to."""

    __slots__ = ("job", "gathered", "value", "exit_code", "notes")

    def __init__(
        self, job: Job, gathered: Optional[Gathered], value: Any = None, exit_code: Optional[int] = None
    ) -> None:
        self.job = job
        self.gathered = gathered if gathered is not None else Gathered([], [])
        self.value = value
        if exit_code is None:
            assert gathered is not None, "an answer made of the ranks' answers says its exit code"
            exit_code = gathered.exit_code()
        self.exit_code: int = exit_code
        self.notes: List[str] = []


class Kind:
    """A TARGET. `text`: as the user gave it; `command`: the command asked of it, for messages."""

    # What the target is, after its text: "... is a record of a job that has ended".
    described = "a target"

    def __init__(self, text: str, command: str) -> None:
        self.text = text
        self.command = command
        self.source = text  # how a file written of it names where it came from
        self.notes: Sequence[str] = ()  # what finding the target found worth saying

    # What to do instead, after the error of a command this kind cannot answer (None: NotLive's).
    instead: Optional[str] = None

    def not_for(self, what: Optional[str] = None) -> NotLive:
        """The error for `what` (the command by default), which this kind cannot answer."""
        what = what or f"`{self.command}`"
        return NotLive(f"{what} needs a live process: {self.text} is {self.described}", hint=self.instead)

    # --- what a live process does, and a job does on each of its ranks ---------------------------

    def each(self, work: Callable[[Target], Any], extra_s: float) -> Answer:
        """`work` on the process (One), or on every rank at once (Ranks); `extra_s`: how long a
        rank's work may take beyond its attach."""
        raise self.not_for()

    def process(self) -> Target:
        """The one live process, for what is done to a process alone (detach, inject, repl)."""
        raise self.not_for()

    def glance(self, timeout: float) -> Answer:
        """`ranks`: each rank of the job at a glance (a job's alone)."""
        raise self.not_for()

    def top(self, timeout: float) -> Any:
        """`top`: a watch whose `refresh()` gives one view (engine/top.py), again and again."""
        raise self.not_for()

    def refuse_live_stacks(self, native: bool, children: bool) -> None:
        """For a snapshot (a record, a core file): native frames and descendants are read from a
        live process only."""
        for option, given in (("--native", native), ("--children", children)):
            if given:
                raise self.not_for(f"backtrace {option}")

    # --- what a snapshot answers too --------------------------------------------------------------

    def stacks(
        self, locals: bool, thread: Optional[str], timeout: float, native: bool, children: bool,
        attach_children: bool,
    ) -> Answer:  # fmt: skip
        raise self.not_for()

    def query(self, sql: str, timeout: float, scan_budget: float, step_wait: float) -> Answer:
        """The rows of `sql` (One of a result with columns, types, rows and notes), or Ranks."""
        raise self.not_for()

    def describe(self, timeout: float) -> Answer:
        """Every table with its columns: One of the list, or Ranks."""
        raise self.not_for()

    def hang(self, duration: float, samples: int, timeout: float, carriers: Sequence[str]) -> Answer:
        raise self.not_for()

    def stragglers(self, duration: float, timeout: float) -> Answer:
        """`stragglers`: which rank the job waits for (a job's alone)."""
        raise self.not_for()

    def memory(
        self, growth: Optional[float], cuda_snapshot: bool, interval: Optional[float], top: int,
        timeout: float, scan_budget: float, live_options: Sequence[str],
    ) -> Answer:  # fmt: skip
        """`live_options`: the options given that only a live process answers (for the error)."""
        raise self.not_for()

    def report(self, timeout: float, hang_duration: float, hang_samples: int, tensors: bool) -> Answer:
        raise self.not_for()

    def timeline(self, steps: Any, timeout: float) -> Answer:
        """The traced rows of `steps` for `trace export`."""
        raise self.not_for()

    def module_flame(self, steps: Optional[str], timeout: float) -> Answer:
        """`flamegraph --torch`: what tracing measured, by module."""
        raise self.not_for()

    def sampled_flame(self, duration: float, rate: float, timeout: float, outside: bool) -> Answer:
        """`flamegraph`: stacks sampled over `duration`."""
        raise self.not_for("`flamegraph` without --torch (sampling)")
