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


def watch(
    pid: int, sample: Sampler, duration: float, samples: int, code_line: Callable[[Dict[str, Any]], str]
) -> HangReport:
    """Take `samples` stack samples spread over `duration` seconds and compare them."""
    samples = max(2, samples)
    interval = duration / (samples - 1)
    started = time.monotonic()
    first_rows = sample()
    first_threads = _by_thread(first_rows)
    ticks_before = {key: _cpu_ticks(pid, frames[0]["native_id"]) for key, frames in first_threads.items()}
    wakeups_before = {key: _wakeups(pid, frames[0]["native_id"]) for key, frames in first_threads.items()}
    signatures: Dict[Tuple[Any, Any], Set[Tuple[Any, ...]]] = {}
    last: Dict[Tuple[Any, Any], Rows] = {}
    taken = 0
    for index in range(samples):
        rows = first_rows if index == 0 else sample()
        taken += 1
        for key, frames in _by_thread(rows).items():
            signatures.setdefault(key, set()).add(_signature(frames))
            last[key] = frames
        if index < samples - 1:
            time.sleep(max(0.0, started + interval * (index + 1) - time.monotonic()))
    elapsed = time.monotonic() - started
    clock = os.sysconf("SC_CLK_TCK")
    threads = []
    for key, frames in last.items():
        first = frames[0]
        before, after = ticks_before.get(key), _cpu_ticks(pid, first["native_id"])
        cpu = None if before is None or after is None else 100.0 * (after - before) / clock / elapsed
        woke_before, woke_after = wakeups_before.get(key), _wakeups(pid, first["native_id"])
        wakeups = None if woke_before is None or woke_after is None else (woke_after - woke_before) / elapsed
        moved = len(signatures[key]) > 1 or (wakeups or 0.0) > WAKEUPS_PER_S
        state = thread_state(frames, code_line)
        threads.append(
            ThreadReport(
                pid, first["thread_id"], first["native_id"], first["thread_name"], bool(first["is_main"]),
                moved, wakeups, cpu, state, _where(frames),
            )
        )  # fmt: skip
    main = next((thread for thread in threads if thread.is_main), None)
    hung = main is not None and not main.moved and (main.cpu_percent or 0.0) < BUSY_CPU_SHARE * 100
    return HangReport(
        pid, hung, elapsed, taken, sorted(threads, key=lambda t: (not t.is_main, str(t.name))), None
    )


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
