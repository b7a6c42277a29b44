"""`hang` for one process: sample its stacks over a while (through the agent, or from outside
when it cannot answer); analysis.progress judges them. For a main thread waiting on a
DataLoader, the worker holding the batch is found among the descendants."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, cast

from ..analysis.carriers import unmatched
from ..analysis.progress import CodeLine, HangReport, Rows, Sample, stuck_dataloader_worker, verdict
from ..client.discovery import python_version_of
from ..errors import ProbingError, UsageError
from ..outside.pyspy import dump, rows_from_dump
from ..procfs import thread_cpu_ticks, thread_wakeups
from ..schema.tables import THREADS
from .backtrace import Stacks, read_stacks
from .processes import descendants
from .target import Target
from .watched import watch_remote

if TYPE_CHECKING:
    from ..schema.rows import ThreadsRow

# Sampling is here, judging in analysis.progress (pure: no /proc, no clock, no sleep).

# How the tables read after a remote watch are built: as jobs/hang.py's collectives_of asks.
TABLE_PARAMS = {"scan_budget_s": 0.5, "step_wait_s": 0.0}


def take_sample(pid: int, rows: Rows, process: Dict[str, Any], tasks: Sequence[Any] = ()) -> Sample:
    """A Sample of `rows` just read, with the /proc counters of their threads read now.
    `process` is the backtrace's process info: its "outside" (py-spy's threads, when the stacks
    were read from outside) says which thread holds the GIL."""
    natives = {row["native_id"] for row in rows}
    counters = {native: (thread_cpu_ticks(pid, native), thread_wakeups(pid, native)) for native in natives}
    holder = next(
        (native for native, thread in (process.get("outside") or {}).items() if thread.get("owns_gil")),
        None,
    )
    return Sample(time.monotonic(), rows, counters, holder, tasks)


def watch(
    pid: int,
    sample: Callable[[], Sample],
    duration: float,
    samples: int,
    code_line: CodeLine,
    carriers: Sequence[str] = (),
) -> HangReport:
    """Take `samples` samples spread over `duration` seconds and judge them (`verdict`). Samples
    far slower than their share (thousands of threads) are fewer, not late: one that ends past
    the window and its next slot too is the last (two at least), so the check lasts about
    `duration`, or two samples where one alone takes longer. A sample merely late (a loaded
    machine) still has the rest follow."""
    samples = max(2, samples)
    interval = duration / (samples - 1)
    started = time.monotonic()
    taken = []
    for index in range(samples):
        taken.append(sample())
        if index == samples - 1 or (index >= 1 and time.monotonic() - started >= duration + interval):
            break
        time.sleep(max(0.0, started + interval * (index + 1) - time.monotonic()))
    return verdict(pid, taken, code_line, carriers)


def remote_counters(target: Target, timeout: float) -> Dict[Any, Tuple[Optional[int], Optional[int]]]:
    """native_id -> (CPU ticks, None) of a remote process's threads, as its agent reads them on
    its own node (python.threads); wake-ups are not reported. Empty when the agent gives none:
    the verdict then rests on the stacks alone."""
    clock = os.sysconf("SC_CLK_TCK")
    try:
        with target.connect(timeout) as client:
            # Typed as the schema has them: decoding refused other column types (client/replies.py).
            rows = cast("List[ThreadsRow]", client.fetch_table(THREADS.name, timeout=timeout).to_rows())
    except ProbingError as error:
        target.log(f"no CPU times of its threads from the agent: {error.message}")
        return {}
    counters: Dict[Any, Tuple[Optional[int], Optional[int]]] = {}
    for row in rows:
        user, system = row.get("cpu_user_s"), row.get("cpu_system_s")
        if isinstance(user, float) and isinstance(system, float) and row.get("native_id") is not None:
            counters[row["native_id"]] = (round((user + system) * clock), None)
    return counters


def _check_names(carriers: Sequence[str], rows: Rows, pid: int) -> None:
    """A --thread that names no thread is a typo or another job: said at the first sample, not
    after the whole window, with the names there are."""
    names = list(dict.fromkeys(str(row["thread_name"]) for row in rows))
    wrong = unmatched(carriers, names)
    if wrong:
        raise UsageError(
            f"--thread {', '.join(map(repr, wrong))}: no such thread in PID {pid}; "
            f"its threads: {', '.join(map(repr, names)) or 'none'}",
            hint="give a thread's name as `hang` lists it, or a glob ('worker-*')",
        )


class HangAnswer(NamedTuple):
    report: HangReport
    worker: Optional[Stacks]  # the stuck DataLoader worker, with locals, when there is one
    notes: List[str]
    # The tables asked for after the window, name -> rows (None: the agent gave none); None
    # when the process was not watched by its agent in one request (watched.py).
    tables: Optional[Dict[str, Optional[List[Any]]]] = None


def _watched_by_its_agent(
    target: Target,
    duration: float,
    samples: int,
    timeout: float,
    code_line: CodeLine,
    carriers: Sequence[str],
    tables: Sequence[str],
) -> Optional[HangAnswer]:
    """A remote process's answer from its agent's own samples (watched.py); None when its agent
    has no `watch`."""
    watched = watch_remote(target, duration, samples, timeout, tables, TABLE_PARAMS)
    if watched is None:
        return None
    if carriers:
        _check_names(carriers, watched.samples[0].rows, watched.pid)
    report = verdict(watched.pid, watched.samples, code_line, carriers)
    return HangAnswer(report, None, watched.notes, watched.tables)


def sample_hang(
    target: Target,
    duration: float,
    samples: int,
    timeout: float,
    code_line: CodeLine,
    carriers: Sequence[str] = (),
    tables: Sequence[str] = (),
) -> HangAnswer:
    """`carriers`: the names (or globs) of the threads that carry the process (--thread), each a
    thread of the first sample or a UsageError. A process on another node is watched by its own
    agent in one request, the names checked after it, `tables` read after the window (watched.py)."""
    if target.remote:
        watched = _watched_by_its_agent(target, duration, samples, timeout, code_line, carriers, tables)
        if watched is not None:
            return watched
    # A remote agent's samples are all there is: its PID (on its node) only names it.
    pid = target.agent_pid(timeout) if target.remote else target.require_pid("hang")
    notes: List[str] = []
    names_checked = not carriers

    def sample() -> Sample:
        nonlocal names_checked
        stacks = read_stacks(target, False, None, timeout)
        notes.extend(note for note in stacks.notes if note not in notes)
        if not names_checked:
            _check_names(carriers, stacks.rows, pid)
            names_checked = True
        if target.remote:
            # Its threads' counters are in its own node's /proc: here the same PID is another
            # process, or none. Its agent reads their CPU time there (python.threads).
            counters = remote_counters(target, timeout)
            return Sample(time.monotonic(), stacks.rows, counters, None, stacks.tasks)
        return take_sample(pid, stacks.rows, stacks.info, stacks.tasks)

    report = watch(pid, sample, duration, samples, code_line, carriers)
    main = next((thread for thread in report.threads if thread.is_main), None)
    if main is None or main.state != "waiting for a DataLoader worker" or target.remote:
        return HangAnswer(report, None, notes)
    worker_rows: Dict[int, Rows] = {}
    commands: Dict[int, str] = {}
    for child, command in descendants(pid):
        commands[child] = command
        try:
            worker_rows[child] = rows_from_dump(child, dump(child, timeout=timeout, locals=True))
        except ProbingError:
            continue
    report = report._replace(worker=stuck_dataloader_worker(worker_rows))
    if report.worker is None:
        return HangAnswer(report, None, notes)
    worker = int(report.worker["pid"])
    # Locals of the innermost frames and of __getitem__ only (the index, the path being read),
    # as the CI watchdog shows them: every frame's locals would bury them.
    rows: Rows = [
        {**row, "locals": row["locals"] if row["depth"] == 0 or row["func"] == "__getitem__" else None}
        for row in worker_rows[worker]
    ]
    info = {"pid": worker, "python_version": python_version_of(worker),
            "argv": commands.get(worker, "").split()[1:]}  # fmt: skip
    return HangAnswer(report, Stacks(worker, rows, info, []), notes)
