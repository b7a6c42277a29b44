"""Hang detection: sample every thread's stack over a while and say what has not moved.

A thread has moved when its stack changed between two samples, or when it kept waking up
in the same place (more than WAKEUPS_PER_S voluntary context switches a second: a loop
that spends its time in one `time.sleep` line looks still to any sampler, but not to the
kernel). The process is hung when its main thread did not move and did not use the CPU
either (a main thread inside one long C call, using the CPU in the same place, is busy,
not hung). A DataLoader main thread polling its queue every 5 s stays under the rate. For a DataLoader main
thread waiting for a batch, the worker that holds it is found among the descendants (the
one inside the dataset's __getitem__) and shown with the index it is stuck on.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple

from .states import thread_state

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


class HangReport(NamedTuple):
    pid: int
    hung: bool
    duration_s: float
    samples: int
    threads: List[ThreadReport]
    worker: Optional[Dict[str, Any]]  # the DataLoader worker holding the missing batch

    def to_json(self) -> Dict[str, Any]:
        return {
            "pid": self.pid,
            "hung": self.hung,
            "duration_s": round(self.duration_s, 3),
            "samples": self.samples,
            "threads": [thread._asdict() for thread in self.threads],
            "dataloader_worker": self.worker,
        }


def _cpu_ticks(pid: int, native_id: Any) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/task/{native_id}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def _wakeups(pid: int, native_id: Any) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/task/{native_id}/status", "rb") as status:
            for line in status:
                if line.startswith(b"voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _signature(frames: Rows) -> Tuple[Any, ...]:
    return tuple((frame["file"], frame["func"], frame["lineno"]) for frame in frames)


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
    counters = {native: (_cpu_ticks(pid, native), _wakeups(pid, native)) for native in natives}
    holder = next(
        (native for native, thread in (process.get("outside") or {}).items() if thread.get("owns_gil")),
        None,
    )
    return Sample(time.monotonic(), rows, counters, holder)


def verdict(pid: int, samples: List[Sample], code_line: Callable[[Dict[str, Any]], str]) -> HangReport:
    """Whether the process progressed over `samples` (at least two), and what each thread did."""
    first, final = samples[0], samples[-1]
    elapsed = max(1e-6, final.taken - first.taken)
    signatures: Dict[Tuple[Any, Any], Set[Tuple[Any, ...]]] = {}
    last: Dict[Tuple[Any, Any], Rows] = {}
    for taken in samples:
        for key, frames in _by_thread(taken.rows).items():
            signatures.setdefault(key, set()).add(_signature(frames))
            last[key] = frames
    clock = os.sysconf("SC_CLK_TCK")
    threads = []
    for key, frames in last.items():
        top = frames[0]
        native = top["native_id"]
        before, woke_before = first.counters.get(native, (None, None))
        after, woke_after = final.counters.get(native, (None, None))
        cpu = None if before is None or after is None else 100.0 * (after - before) / clock / elapsed
        wakeups = None if woke_before is None or woke_after is None else (woke_after - woke_before) / elapsed
        moved = len(signatures[key]) > 1 or (wakeups or 0.0) > WAKEUPS_PER_S
        state = thread_state(frames, code_line)
        threads.append(
            ThreadReport(
                pid, top["thread_id"], native, top["thread_name"], bool(top["is_main"]),
                moved, wakeups, cpu, state, _where(frames),
            )
        )  # fmt: skip
    main = next((thread for thread in threads if thread.is_main), None)
    hung = main is not None and not main.moved and (main.cpu_percent or 0.0) < BUSY_CPU_SHARE * 100
    return HangReport(
        pid, hung, elapsed, len(samples), sorted(threads, key=lambda t: (not t.is_main, str(t.name))), None
    )


def watch(
    pid: int,
    sample: Callable[[], Sample],
    duration: float,
    samples: int,
    code_line: Callable[[Dict[str, Any]], str],
) -> HangReport:
    """Take `samples` samples spread over `duration` seconds and judge them (`verdict`)."""
    samples = max(2, samples)
    interval = duration / (samples - 1)
    started = time.monotonic()
    taken = []
    for index in range(samples):
        taken.append(sample())
        if index < samples - 1:
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
