"""Hang detection: sample every thread's stack over a while; say whether the process progresses.

This is the one definition of progress, used by `probing PID hang` (`watch`), the
`probing run --hang-timeout` watchdog (`ProgressTracker`, the same verdict over a rolling
window) and the whole-job view. Over a window of samples, each thread is

- moved: its Python stack changed between two samples read the same way (the agent's rows
  and py-spy's are compared only among themselves: the two name frames differently);
- busy: it stayed in one place but used at least BUSY_CPU_SHARE of a CPU (a long C call);
- looping: it stayed on one line that is a wait (time.sleep, Event.wait, a queue get with a
  timeout, select...) and kept waking up there without using the CPU: more than WAKEUPS_PER_S
  voluntary context switches a second, or at least LOOP_MIN_WAKEUPS of them and one every
  1/LOOP_WAKEUPS_PER_S seconds (`while True: time.sleep(1)`). A polling loop, or a timed wait
  that never gets what it waits for. Wake-ups are not progress: a thread waiting for the GIL
  wakes up every 5 ms to ask for it;
- still: none of these.

A thread that kept waking up and used the CPU (work between its waits: a step, then a sleep),
or kept waking up on a line that is not a wait (I/O inside one C call), counts as moved.
Wake-ups are counted only over the longest run of samples the agent gave one after the other:
py-spy stops each thread it reads, which wakes it up, so counts across its samples are its own
doing (the first sample is often read by py-spy, while an attach brings the agent up).

The process progresses when a thread that carries it moved or was busy. The threads that carry
it are, in this order:
- those the user named (`--thread NAME`, a name or a glob), when any of them is there;
- the other threads, while the main thread only waits for them: Thread.join, the interpreter's
  shutdown waiting for non-daemon threads, starting one;
- the main thread and the other threads, while the main thread only loops on a wait that
  nothing outside the process answers (a supervisor: `while True: time.sleep(1)`, a 0.1 s poll,
  a server's accept loop, while workers do the work). A main thread that waits on another
  process (a DataLoader worker, a multiprocessing queue, a child, a collective) loops for it,
  and its own other threads do not answer it;
- the main thread alone otherwise. A main thread blocked in one wait that never came back (a
  lock, an Event without timeout) is stuck, whatever background threads (heartbeats, loggers)
  do: the verdict names those that moved, and --thread is how to say that they carry the job.
The verdict says which threads decided and why. One exception comes first: a thread seen holding
the GIL in every sample without moving or using the CPU stops every thread of the process from
running Python: the process is hung, whatever else woke up.

For a DataLoader main thread waiting for a batch, the worker that holds it is found among the
descendants (the one inside the dataset's __getitem__) and shown with the index it is stuck on.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from .asyncio_tasks import describe_stuck, loop_tasks, task_signatures
from .carriers import carriers_of, thread_list, thread_options
from .states import is_waiting, thread_state

if TYPE_CHECKING:
    from ..schema.rows import AsyncioTasksRow, BacktraceRow

Rows = List["BacktraceRow"]
CodeLine = Callable[["BacktraceRow"], str]  # a frame's source line (engine/sources.py reads it)
Sampler = Callable[[], Rows]

# A main thread that used at least this share of one CPU over the window is busy, not hung.
BUSY_CPU_SHARE = 0.05
WAKEUPS_PER_S = 4.0
# A slower loop on a wait (a supervisor's `while True: time.sleep(1)`) is looping too when it came
# back to its wait at least twice, once every 10 s at least: a thread blocked in one wait wakes
# up only for a stray signal.
LOOP_MIN_WAKEUPS = 2
LOOP_WAKEUPS_PER_S = 0.1


class ThreadReport(NamedTuple):
    pid: int
    thread_id: Any
    native_id: Any
    name: str
    is_main: bool
    moved: bool
    wakeups_per_s: Optional[float]
    cpu_percent: Optional[float]
    state: str
    where: str  # innermost Python frame: "func (file:line)"
    activity: str = "still"  # moved, busy, looping or still (the module docstring says which is progress)
    holds_gil: bool = False  # seen holding the GIL in every sample (from outside, by py-spy)
    carries: bool = False  # one of the threads whose progress decided the verdict
    # A thread running an asyncio loop whose tasks all awaited the same futures throughout: the
    # tasks and where they await (analysis/asyncio_tasks.py describe_stuck); "" otherwise.
    stuck_tasks: str = ""


class HangReport(NamedTuple):
    pid: int
    hung: bool
    duration_s: float
    samples: int
    threads: List[ThreadReport]
    worker: Optional[Dict[str, Any]]  # the DataLoader worker holding the missing batch
    reason: str = ""  # the verdict in one sentence: which threads decided it and why

    def to_json(self) -> Dict[str, Any]:
        return {
            "pid": self.pid,
            "hung": self.hung,
            "duration_s": round(self.duration_s, 3),
            "samples": self.samples,
            "threads": [thread._asdict() for thread in self.threads],
            "dataloader_worker": self.worker,
            "reason": self.reason,
        }


def _signature(frames: Rows) -> Tuple[Any, ...]:
    # Python frames only, by file name: py-spy's native frames come and go between dumps, and
    # a relative co_filename and py-spy's path of the same file differ.
    return tuple(
        (os.path.basename(str(frame["file"])), frame["func"], frame["lineno"])
        for frame in frames
        if frame.get("frame_type") != "Native"
    )


def _source(rows: Rows) -> str:
    return "py-spy" if any(row.get("source") == "py-spy" for row in rows) else "agent"


def _by_thread(rows: Rows) -> Dict[Tuple[Any, Any], Rows]:
    threads: Dict[Tuple[Any, Any], Rows] = {}
    for row in rows:
        threads.setdefault((row["pid"], row["thread_id"]), []).append(row)
    for frames in threads.values():
        frames.sort(key=lambda frame: frame["depth"] or 0)
    return threads


def _where(frames: Rows) -> str:
    python = [frame for frame in frames if frame.get("frame_type") != "Native"]
    if not python:
        return "(no Python frame)"
    frame = python[0]
    return f"{frame['func']} ({os.path.basename(str(frame['file']))}:{frame['lineno']})"


class Sample(NamedTuple):
    """One look at a process: its stacks and, per thread, the kernel's counters at that moment."""

    taken: float  # time.monotonic() when it was read
    rows: Rows  # python.backtrace rows of the process
    counters: Dict[Any, Tuple[Optional[int], Optional[int]]]  # native_id -> (CPU ticks, wake-ups)
    gil_holder: Optional[Any]  # native_id of the thread seen holding the GIL, when read from outside
    tasks: Sequence[AsyncioTasksRow] = ()  # python.asyncio_tasks rows, where a thread runs a loop


def _activity(
    moved: bool, cpu: Optional[float], wakeups: Optional[float], woke: Optional[int], waiting: bool
) -> str:
    """`wakeups`: a second, `woke`: in all over the window (None: not counted)."""
    working = (cpu or 0.0) >= BUSY_CPU_SHARE * 100
    if moved:
        return "moved"
    if (wakeups or 0.0) > WAKEUPS_PER_S:
        # Woken on a wait line and then using the CPU: it works between its waits (a training
        # step, then time.sleep), the samples only ever caught it waiting.
        return "looping" if waiting and not working else "moved"
    if waiting and not working and (woke or 0) >= LOOP_MIN_WAKEUPS and (wakeups or 0.0) >= LOOP_WAKEUPS_PER_S:
        return "looping"
    return "busy" if working else "still"


def _agent_run(samples: List[Sample]) -> Optional[Tuple[Sample, Sample]]:
    """The first and last samples of the longest run of samples the agent gave one after the
    other (two at least): wake-ups are counted between them."""
    best: Optional[Tuple[int, int]] = None
    start: Optional[int] = None
    for index, taken in enumerate(samples):
        if _source(taken.rows) != "agent":
            start = None
            continue
        start = index if start is None else start
        if index > start and (best is None or index - start > best[1] - best[0]):
            best = (start, index)
    return None if best is None else (samples[best[0]], samples[best[1]])


def _wakeups(native: Any, first: Sample, final: Sample) -> Tuple[Optional[int], Optional[float]]:
    """A thread's wake-ups between two samples: in all, and a second."""
    before, after = first.counters.get(native, (None, None))[1], final.counters.get(native, (None, None))[1]
    if before is None or after is None:
        return None, None
    return after - before, (after - before) / max(1e-6, final.taken - first.taken)


def _loop_progress(samples: List[Sample]) -> Tuple[Dict[Any, bool], Dict[Any, str]]:
    """Per thread running an asyncio loop (by thread_id): whether its tasks moved between the
    samples that read them (a task came or went, or one awaited another future or elsewhere),
    and its tasks in words as the last sample saw them."""
    seen: Dict[Any, Set[Any]] = {}
    for taken in samples:
        if taken.tasks:
            for thread_id, signature in task_signatures(taken.tasks).items():
                seen.setdefault(thread_id, set()).add(frozenset(signature))
    last = next((taken.tasks for taken in reversed(samples) if taken.tasks), ())
    described = {thread_id: describe_stuck(tasks) for thread_id, tasks in loop_tasks(last).items() if tasks}
    return {thread_id: len(kinds) > 1 for thread_id, kinds in seen.items()}, described


def verdict(
    pid: int,
    samples: List[Sample],
    code_line: CodeLine,
    carriers: Sequence[str] = (),
) -> HangReport:
    """Whether the process progressed over `samples` (at least two), and what each thread did,
    by the definition in the module docstring; `carriers`: the names (or globs) of the threads
    that carry the process (--thread), when the user said."""
    first, final = samples[0], samples[-1]
    elapsed = max(1e-6, final.taken - first.taken)
    signatures: Dict[Tuple[Any, Any, str], Set[Tuple[Any, ...]]] = {}
    last: Dict[Tuple[Any, Any], Rows] = {}
    for taken in samples:
        source = _source(taken.rows)
        for key, frames in _by_thread(taken.rows).items():
            signatures.setdefault((key[0], key[1], source), set()).add(_signature(frames))
            last[key] = frames
    tasks_moved, stuck_tasks = _loop_progress(samples)
    span = _agent_run(samples)
    holders = {taken.gil_holder for taken in samples}
    holder = final.gil_holder if len(holders) == 1 else None
    clock = os.sysconf("SC_CLK_TCK")
    threads = []
    for key, frames in last.items():
        top = frames[0]
        native = top["native_id"]
        before, after = (
            first.counters.get(native, (None, None))[0],
            final.counters.get(native, (None, None))[0],
        )
        cpu = None if before is None or after is None else 100.0 * (after - before) / clock / elapsed
        # Shown over the whole window where py-spy read every sample; the activity rests on them
        # only where the agent gave a run of samples.
        woke, wakeups = _wakeups(native, *(span or (first, final)))
        moved = any(len(seen) > 1 for (p, t, _), seen in signatures.items() if (p, t) == key)
        state = thread_state(frames, code_line)
        counted = span is not None
        activity = _activity(
            moved, cpu, wakeups if counted else None, woke if counted else None, is_waiting(state)
        )
        if activity in ("looping", "still") and tasks_moved.get(top["thread_id"]):
            activity = "moved"  # its loop's tasks moved between the samples (a wait ended, one started)
        holds_gil = holder is not None and native == holder
        if holds_gil:
            state = thread_state(frames, code_line, {"owns_gil": True})
        threads.append(
            ThreadReport(
                pid, top["thread_id"], native, top["thread_name"] or "", bool(top["is_main"]),
                activity == "moved", wakeups, cpu, state, _where(frames), activity, holds_gil,
                stuck_tasks=stuck_tasks.get(top["thread_id"], "") if activity != "moved" else "",
            )
        )  # fmt: skip
    threads.sort(key=lambda t: (not t.is_main, str(t.name)))
    hung, reason, deciders = _judge(threads, last, carriers)
    decided = {(thread.pid, thread.thread_id) for thread in deciders}
    threads = [thread._replace(carries=(thread.pid, thread.thread_id) in decided) for thread in threads]
    return HangReport(pid, hung, elapsed, len(samples), threads, None, reason)


def _judge(
    threads: List[ThreadReport], frames: Dict[Tuple[Any, Any], Rows], patterns: Sequence[str]
) -> Tuple[bool, str, List[ThreadReport]]:
    """(hung, the verdict in one sentence, the threads that decided it)."""
    progressing = ("moved", "busy")
    holder = next((thread for thread in threads if thread.holds_gil), None)
    if holder is not None and holder.activity not in progressing:
        return True, f"thread {holder.name!r} held the GIL without moving or using the CPU", [holder]
    carriers, basis = carriers_of(threads, frames, patterns)
    if not carriers:
        return True, "no thread was seen", []
    basis = f"; {basis}" if basis else ""
    for activity in progressing:
        mover = next((thread for thread in carriers if thread.activity == activity), None)
        if mover is not None:
            how = "moved" if activity == "moved" else "was busy (in one place, using the CPU)"
            return False, f"thread {mover.name!r} {how}{basis}", carriers
    loopers = [thread for thread in carriers if thread.activity == "looping"]
    woke = f"; {thread_list(loopers)} only woke up to wait again" if loopers else ""
    for loop in (thread for thread in carriers if thread.stuck_tasks):
        woke += (
            f"; the asyncio loop of {loop.name!r} idled while every task awaited the same futures: "
            f"{loop.stuck_tasks}"
        )
    # Threads that progressed without carrying the process: a heartbeat, or the real work of a
    # job whose main thread waits in a way the rule cannot tell from being stuck.
    bystanders = [thread for thread in threads if thread.activity in progressing and thread not in carriers]
    hint = ""
    if bystanders:
        carry = "it carries" if len(bystanders) == 1 else "they carry"
        say = thread_options([str(thread.name) for thread in bystanders])
        hint = f"; {thread_list(bystanders)} progressed: if {carry} the job, say so with {say}"
    return (
        True,
        f"no thread that carries the process moved ({thread_list(carriers)}){basis}{woke}{hint}",
        carriers,
    )


class ProgressTracker:
    """The same definition of progress over a rolling window, for `probing run --hang-timeout`:
    each new sample is judged against the last one that showed progress."""

    def __init__(self, pid: int, code_line: CodeLine, carriers: Sequence[str] = ()) -> None:
        self.pid = pid
        self.code_line = code_line
        self.carriers = carriers  # --thread: the names of the threads that carry the process
        self.window: List[Sample] = []  # the samples since the last progress

    def add(self, sample: Sample) -> HangReport:
        """The verdict from the last progress up to `sample`; progress restarts the window."""
        self.window.append(sample)
        window = self.window if len(self.window) > 1 else self.window * 2
        report = verdict(self.pid, window, self.code_line, self.carriers)
        if not report.hung:
            self.window = [sample]
        return report

    def progressed(self) -> None:
        """Something outside the stacks showed progress (a distributed job's collectives
        completing on every rank): the window restarts at the last sample."""
        self.window = self.window[-1:]

    def stalled_s(self, now: float) -> float:
        return 0.0 if not self.window else now - self.window[0].taken


def stuck_dataloader_worker(worker_rows: Dict[int, Rows]) -> Optional[Dict[str, Any]]:
    """Among DataLoader workers' stacks (with locals), the one inside the dataset's __getitem__."""
    for worker_pid, rows in worker_rows.items():
        for frames in _by_thread(rows).values():
            for frame in frames:
                if frame["func"] == "__getitem__":
                    local_values = json.loads(frame["locals"]) if frame["locals"] else {}
                    index = next(
                        (
                            local_values[name]
                            for name in ("index", "idx", "i", "item", "key")
                            if name in local_values
                        ),
                        None,
                    )
                    return {"pid": worker_pid, "where": _where(frames[frames.index(frame) :]), "index": index}
    return None
