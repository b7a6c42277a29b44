"""process.memory: the sampler, the one timer the agent runs by default.

The value of process.memory is the history from *before* someone noticed the job growing, so it
has to be recording already. One sample reads /proc/self/statm and /proc/self/stat (tens of
microseconds); counting the objects gc tracks is the expensive part (30 ms for a million
objects, holding the GIL), so it is done only as often as keeps it under GC_COUNT_SHARE of the
time, and the rows in between have NULL there. A count lists one generation at a time, and only
a generation whose listing is estimated to hold the GIL at most pacing.MAX_STALL_S
(objects.py): a job that has outgrown that (a job that imported torch usually has) gets NULL,
and the sampler's status says why (`gc_count_left_out`), rather than a stall every so often.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional, Set, Tuple

from ...originals import (
    Event,
    allocate_lock,
    get_ident,
    monotonic,
    process_time,
    thread_time,
    wall_time,
)
from ...procfs import memory_and_threads, open_descriptor_count, process_start_time
from ..lifecycle import WORK, on_fork_in_child, on_stop
from ..pacing import MAX_STALL_S, Pacer
from ..threads import AgentThread
from .cuda import MB, cuda_totals
from .objects import count_objects

DEFAULT_INTERVAL_S = 1.0
DEFAULT_HISTORY_S = 24 * 3600.0
GC_COUNT_SHARE = 0.0003  # counting gc objects may take 0.03% of the time
MIN_INTERVAL_S = 0.1
MAX_RING_ROWS = 1_000_000
SAMPLER_THREAD_NAME = "probing-memory"


def _seconds_from_environment(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("off", "no", "false"):
        return 0.0
    try:
        value = float(text)
    except ValueError:
        return default
    if not math.isfinite(value) or value < 0:
        return default
    return value if value == 0 else max(value, MIN_INTERVAL_S)


class Sampler:
    """process.memory: one row every `interval` seconds into a ring of `history` seconds."""

    def __init__(self, interval: float, history: float, own_threads: Set[int]) -> None:
        self.interval = interval
        self.history = history
        self.own_threads = own_threads
        self.ring: Any = None  # made by the thread: the agent's start imports nothing
        self.first: Optional[Tuple[Any, ...]] = None
        self.samples = 0
        self.cpu_s = 0.0  # CPU time the sampler itself used
        self.gc_every = 1
        self.gc_cost_s = 0.0
        self.gc_left_out: Optional[str] = None  # why the last count was not taken
        self.error: Optional[str] = None
        self.started_at = wall_time()
        self._until_gc_count = 0
        self._wake = Event()
        self._stopping = False
        start = process_start_time()
        elapsed = wall_time() - start if start is not None else 0.0
        # The first sample's cpu_percent is the average since the process started.
        self._previous = (monotonic() - elapsed, 0.0)
        self.thread = AgentThread(target=self._run, name=SAMPLER_THREAD_NAME)

    def _run(self) -> None:
        ident = get_ident()
        self.own_threads.add(ident)
        try:
            self._loop()
        except Exception as error:  # noqa: BLE001 - an exception leaving the thread would print on stderr
            self.error = f"{type(error).__name__}: {error}"
        finally:
            self.own_threads.discard(ident)

    def _loop(self) -> None:
        if self.ring is None:  # a restarted sampler keeps the ring it had
            from ...schema.tables import PROCESS_MEMORY
            from ..ring import Ring

            rows = min(MAX_RING_ROWS, max(1, int(math.ceil(self.history / self.interval))))
            self.ring = Ring(PROCESS_MEMORY.name, PROCESS_MEMORY.column_types(), rows)
        next_at = monotonic()
        while not self._stopping:
            started = thread_time()
            try:
                self.sample()
            except Exception as error:  # noqa: BLE001 - never let sampling die silently
                self.error = f"{type(error).__name__}: {error}"
            self.cpu_s += thread_time() - started
            next_at = max(next_at + self.interval, monotonic())
            self._wake.wait(max(0.0, next_at - monotonic()))
            self._wake.clear()

    def reading(self, count_gc: bool) -> Tuple[Any, ...]:
        """One row of process.memory, read now."""
        now, clock, cpu = wall_time(), monotonic(), process_time()
        rss, vms, threads = memory_and_threads()
        previous_wall, previous_cpu = self._previous
        cpu_percent = (
            100.0 * (cpu - previous_cpu) / (clock - previous_wall) if clock > previous_wall else None
        )
        self._previous = (clock, cpu)
        objects = None
        if count_gc:
            objects, skipped, self.gc_cost_s = count_objects(MAX_STALL_S, Pacer())
            self.gc_left_out = "; ".join(why.describe() for why in skipped) or None
        allocated, reserved = cuda_totals()
        return (
            now, None if rss is None else rss / MB, None if vms is None else vms / MB, cpu_percent,
            threads, open_descriptor_count(), objects, allocated, reserved,
        )  # fmt: skip

    def sample(self) -> None:
        count = self._until_gc_count <= 0
        row = self.reading(count)
        if count:
            self.gc_every = max(1, int(math.ceil(self.gc_cost_s / (GC_COUNT_SHARE * self.interval))))
            self._until_gc_count = self.gc_every
        self._until_gc_count -= 1
        self.ring.append(row)
        if self.first is None:
            self.first = row
        self.samples += 1

    def set_interval(self, interval: float) -> None:
        self.interval = interval
        self._until_gc_count = 0
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def running(self) -> bool:
        return not self._stopping and self.thread.is_alive()

    def status(self) -> Dict[str, Any]:
        alive = wall_time() - self.started_at
        return {
            "running": self.running(),
            "interval_s": self.interval,
            "history_s": self.history,
            "samples": self.samples,
            "rows": len(self.ring) if self.ring is not None else 0,
            "since": self.first[0] if self.first is not None else None,
            "gc_count_every": self.gc_every,
            "gc_count_s": self.gc_cost_s,
            "gc_count_left_out": self.gc_left_out,
            "cpu_s": self.cpu_s,
            "cpu_share": self.cpu_s / alive if alive > 0 else 0.0,
            "error": self.error,
        }


_sampler: Optional[Sampler] = None
_lock = allocate_lock()


def current() -> Optional[Sampler]:
    return _sampler


def start_sampling(own_threads: Set[int], interval: Optional[float] = None) -> Optional[Sampler]:
    """Start (or re-time) the sampler. At agent start the interval comes from
    PROBING_MEMORY_INTERVAL (seconds, default 1; 0 or off: no sampling) and the history from
    PROBING_MEMORY_HISTORY (seconds, default 24 h)."""
    global _sampler
    if interval is None:
        interval = _seconds_from_environment("PROBING_MEMORY_INTERVAL", DEFAULT_INTERVAL_S)
    with _lock:
        sampler = _sampler
        if interval <= 0:
            if sampler is not None:
                sampler.stop()
            return sampler
        if sampler is not None and sampler.running():
            sampler.set_interval(interval)
            return sampler
        history = _seconds_from_environment("PROBING_MEMORY_HISTORY", DEFAULT_HISTORY_S) or DEFAULT_HISTORY_S
        fresh = Sampler(interval, history, own_threads)
        if sampler is not None:  # restarted after `--interval 0`: keep what was recorded
            fresh.ring, fresh.first, fresh.samples = sampler.ring, sampler.first, sampler.samples
        on_stop(stop_sampling, WORK)
        fresh.thread.start()  # returns once the thread runs, so its ident is known
        if fresh.thread.ident is not None:
            own_threads.add(fresh.thread.ident)
        _sampler = fresh
        return fresh


def stop_sampling() -> None:
    """Stop the sampler (a stop hook, at WORK); its rows go with it. Safe to call again."""
    global _sampler
    with _lock:
        sampler, _sampler = _sampler, None
    if sampler is not None:
        sampler.stop()


def forget_after_fork() -> None:
    # The child of a fork has no sampler thread: a DataLoader worker must not inherit one.
    global _sampler, _lock
    _sampler, _lock = None, allocate_lock()


on_fork_in_child(forget_after_fork)
