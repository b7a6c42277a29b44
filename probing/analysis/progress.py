"""Hang detection: sample every thread's stack over a while; say whether the process progresses.

This is the one definition of progress, used by `probing PID hang` (`watch`), the
`probing run --hang-timeout` watchdog (`ProgressTracker`, the same verdict over a rolling
window) and the whole-job view. Over a window of samples, each thread is

- moved: its Python stack changed between two samples read the same way (the agent's rows
  and py-spy's are compared only among themselves: the two name frames differently);
- busy: it stayed in one place but used at least BUSY_CPU_SHARE of a CPU (a long C call);
- looping: it stayed on one line that is a wait (time.sleep, Event.wait, a queue get with a
  timeout, select...) and kept waking up there (more than WAKEUPS_PER_S voluntary context
  switches a second) without using the CPU: a polling loop or a timed wait that never gets
  what it waits for. Wake-ups are not progress: a thread waiting for the GIL wakes up every
  5 ms to ask for it;
- still: none of these.

A thread that kept waking up and used the CPU (work between its waits: a step, then a sleep),
or kept waking up on a line that is not a wait (I/O inside one C call), counts as moved.
Wake-ups are read only when every sample came from the agent: py-spy stops each thread it
reads, which wakes it up, so its samples' counts are its own doing.

The process progresses when a thread that carries it moved or was busy. The thread that
carries a process is its main thread, or, while the main thread only waits for other threads
(Thread.join, the interpreter's shutdown waiting for non-daemon threads, starting one), the
other threads. Background threads (heartbeats, loggers) never make a stuck main thread look
alive. One exception comes first: a thread seen holding the GIL in every sample without moving
or using the CPU stops every thread of the process from running Python: the process is hung,
whatever else woke up.

For a DataLoader main thread waiting for a batch, the worker that holds it is found among the
descendants (the one inside the dataset's __getitem__) and shown with the index it is stuck on.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple

from ..procfs import thread_cpu_ticks, thread_wakeups
from .states import is_waiting, thread_state

Rows = List[Dict[str, Any]]
Sampler = Callable[[], Rows]

# A main thread that used at least this share of one CPU over the window is busy, not hung.
BUSY_CPU_SHARE = 0.05
WAKEUPS_PER_S = 4.0


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


class HangReport(NamedTuple):
    pid: int
    hung: bool
    duration_s: float
    samples: int
    threads: List[ThreadReport]
    worker: Optional[Dict[str, Any]]  # the DataLoader worker holding the missing batch
    reason: str = ""  # the verdict in one sentence: which thread decided it and why

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
        frames.sort(key=lambda frame: frame["depth"])
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


def take_sample(pid: int, rows: Rows, process: Dict[str, Any]) -> Sample:
    """A Sample of `rows` just read, with the /proc counters of their threads read now.
    `process` is the backtrace's process info: its "outside" (py-spy's threads, when the stacks
    were read from outside) says which thread holds the GIL."""
    natives = {row["native_id"] for row in rows}
    counters = {native: (thread_cpu_ticks(pid, native), thread_wakeups(pid, native)) for native in natives}
    holder = next(
        (native for native, thread in (process.get("outside") or {}).items() if thread.get("owns_gil")),
        None,
    )
    return Sample(time.monotonic(), rows, counters, holder)


# While the main thread is in one of these, the process is carried by its other threads.
_WAITS_FOR_THREADS = ("waiting in Thread.join", "waiting for a new thread to start")


def _waits_for_threads(thread: ThreadReport, frames: Rows) -> bool:
    base = thread.state.split(", ", 1)[1] if thread.holds_gil else thread.state
    # After the main script ends, the interpreter joins non-daemon threads in threading._shutdown.
    shutdown = any(
        frame["func"] == "_shutdown" and str(frame["file"]).endswith("threading.py") for frame in frames
    )
    return base in _WAITS_FOR_THREADS or shutdown


def _activity(moved: bool, cpu: Optional[float], wakeups: Optional[float], waiting: bool) -> str:
    working = (cpu or 0.0) >= BUSY_CPU_SHARE * 100
    if moved:
        return "moved"
    if (wakeups or 0.0) > WAKEUPS_PER_S:
        # Woken on a wait line and then using the CPU: it works between its waits (a training
        # step, then time.sleep), the samples only ever caught it waiting.
        return "looping" if waiting and not working else "moved"
    return "busy" if working else "still"


def verdict(pid: int, samples: List[Sample], code_line: Callable[[Dict[str, Any]], str]) -> HangReport:
    """Whether the process progressed over `samples` (at least two), and what each thread did,
    by the definition in the module docstring."""
    first, final = samples[0], samples[-1]
    elapsed = max(1e-6, final.taken - first.taken)
    signatures: Dict[Tuple[Any, Any, str], Set[Tuple[Any, ...]]] = {}
    last: Dict[Tuple[Any, Any], Rows] = {}
    for taken in samples:
        source = _source(taken.rows)
        for key, frames in _by_thread(taken.rows).items():
            signatures.setdefault((key[0], key[1], source), set()).add(_signature(frames))
            last[key] = frames
    wakeups_count = all(_source(taken.rows) == "agent" for taken in samples)
    holders = {taken.gil_holder for taken in samples}
    holder = final.gil_holder if len(holders) == 1 else None
    clock = os.sysconf("SC_CLK_TCK")
    threads = []
    for key, frames in last.items():
        top = frames[0]
        native = top["native_id"]
        before, woke_before = first.counters.get(native, (None, None))
        after, woke_after = final.counters.get(native, (None, None))
        cpu = None if before is None or after is None else 100.0 * (after - before) / clock / elapsed
        wakeups = None if woke_before is None or woke_after is None else (woke_after - woke_before) / elapsed
        moved = any(len(seen) > 1 for (p, t, _), seen in signatures.items() if (p, t) == key)
        state = thread_state(frames, code_line)
        activity = _activity(moved, cpu, wakeups if wakeups_count else None, is_waiting(state))
        holds_gil = holder is not None and native == holder
        if holds_gil:
            state = thread_state(frames, code_line, {"owns_gil": True})
        threads.append(
            ThreadReport(
                pid, top["thread_id"], native, top["thread_name"], bool(top["is_main"]),
                activity == "moved", wakeups, cpu, state, _where(frames), activity, holds_gil,
            )
        )  # fmt: skip
    threads.sort(key=lambda t: (not t.is_main, str(t.name)))
    hung, reason = _judge(threads, last)
    return HangReport(pid, hung, elapsed, len(samples), threads, None, reason)


def _judge(threads: List[ThreadReport], frames: Dict[Tuple[Any, Any], Rows]) -> Tuple[bool, str]:
    progressing = ("moved", "busy")
    holder = next((thread for thread in threads if thread.holds_gil), None)
    if holder is not None and holder.activity not in progressing:
        return True, f"thread {holder.name!r} held the GIL without moving or using the CPU"
    main = next((thread for thread in threads if thread.is_main), None)
    carriers = [main] if main is not None else []
    if main is None or _waits_for_threads(main, frames[(main.pid, main.thread_id)]):
        carriers = [thread for thread in threads if not thread.is_main] or carriers
    if not carriers:
        return True, "no thread was seen"
    for activity in progressing:
        mover = next((thread for thread in carriers if thread.activity == activity), None)
        if mover is not None:
            how = "moved" if activity == "moved" else "was busy (in one place, using the CPU)"
            return False, f"thread {mover.name!r} {how}"
    names = ", ".join(repr(thread.name) for thread in carriers)
    looping = any(thread.activity == "looping" for thread in carriers)
    woke = "; they only woke up to wait again" if looping else ""
    return True, f"no thread that carries the process moved ({names}){woke}"


def watch(
    pid: int,
    sample: Callable[[], Sample],
    duration: float,
    samples: int,
    code_line: Callable[[Dict[str, Any]], str],
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
    return verdict(pid, taken, code_line)


class ProgressTracker:
    """The same definition of progress over a rolling window, for `probing run --hang-timeout`:
    each new sample is judged against the last one that showed progress."""

    def __init__(self, pid: int, code_line: Callable[[Dict[str, Any]], str]) -> None:
        self.pid = pid
        self.code_line = code_line
        self.window: List[Sample] = []  # the samples since the last progress

    def add(self, sample: Sample) -> HangReport:
        """The verdict from the last progress up to `sample`; progress restarts the window."""
        self.window.append(sample)
        report = verdict(self.pid, self.window if len(self.window) > 1 else self.window * 2, self.code_line)
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
                    local_values = json.loads(frame["locals"]) if frame.get("locals") else {}
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
