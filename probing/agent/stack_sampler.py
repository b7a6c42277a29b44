"""`flamegraph`: the stacks of every thread of the job, sampled for a while and counted.

The sampler runs in the connection thread that serves the request (an AgentThread: no tracer,
in the agent's own threads, which are left out of what it counts). Each sample takes the GIL
from the job for as long as `sys._current_frames()` and the walk of its frames take, so that
time is measured around every sample and the interval is stretched until it is at most
COST_SHARE of the wall time: the job loses at most 0.5 % of its GIL time to sampling, however
many threads or frames it has, and at most the requested rate is taken (py-spy's 100 Hz by
default). Only code objects and line numbers are read: never a local, never tensor data.

What is kept is bounded: MAX_STACKS distinct stacks (the rest are counted under one "stacks
past the cap" entry per thread) of at most MAX_DEPTH frames each (deeper stacks keep their
innermost frames, under a marker). One sampling runs at a time per agent; it ends early when
the client goes away or the agent stops.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .lifecycle import on_stop
from .requests import ErrorKind, RequestError
from .stacks import leaving

# The share of wall time the sampler may hold the GIL: half of the 1 % the job may lose.
COST_SHARE = 0.005
MAX_DURATION_S = 600.0
MAX_RATE_HZ = 1000.0
DEFAULT_RATE_HZ = 100.0
MAX_STACKS = 4096
MAX_DEPTH = 128
# Where the interpreter can say which line an instruction offset is on (3.10+), a sample keeps
# the offset (f_lasti) and the line is found once per distinct offset when the answer is made:
# f_lineno computes it from the line table on every read, half the cost of a sample.
OFFSETS = hasattr(CodeType, "co_lines")
# Thread names are read again this often: threads come and go, and names change.
NAMES_EVERY_S = 1.0
# How often, at most, the client's socket is polled for a hang-up while sampling.
CLIENT_CHECK_S = 0.25

_busy = threading.Lock()
_cancel = threading.Event()

# A stack as counted: the thread's name, then (id of code, line) pairs innermost first; a
# code id of 0 stands for frames cut by MAX_DEPTH.
StackKey = Tuple[Any, ...]


def cancel() -> None:
    """End a sampling now (a stop hook: the agent is stopping)."""
    _cancel.set()


def _after_fork_in_child() -> None:
    # A child forked mid-sampling has no sampler thread: its lock must not stay taken.
    global _busy, _cancel
    _busy, _cancel = threading.Lock(), threading.Event()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Sampling:
    """Counts of folded stacks over one sampling, and what it cost."""

    def __init__(self, exclude: Set[int]) -> None:
        self.exclude = exclude
        self.counts: Dict[StackKey, int] = {}
        self.overflow: Dict[str, int] = {}  # thread -> samples of stacks past MAX_STACKS
        self.samples = 0
        self.cost_s = 0.0
        self.deep = 0  # stacks cut at MAX_DEPTH
        self.names: Dict[int, str] = {}
        self.codes: Dict[int, CodeType] = {}
        self.names_at = -NAMES_EVERY_S

    def _refresh_names(self, now: float) -> None:
        self.names = {thread.ident or 0: thread.name for thread in threading.enumerate()}
        self.names_at = now

    def sample(self) -> float:
        """Take one sample; the seconds it held the GIL."""
        started = time.perf_counter()
        if started - self.names_at >= NAMES_EVERY_S:
            self._refresh_names(started)
        # In a function of its own: no reference to a frame (nor to its locals) outlives it.
        self._count_all()
        self.samples += 1
        spent = time.perf_counter() - started
        self.cost_s += spent
        return spent

    def _count_all(self) -> None:
        counts, names, exclude = self.counts, self.names, self.exclude
        depths, offsets = range(MAX_DEPTH), OFFSETS  # locals: read for every frame
        for ident, frame in sys._current_frames().items():
            if ident in exclude or ident in leaving:
                continue
            # Code objects by id: hashing a code object hashes its bytecode and constants, which
            # made a sample 3 times slower. `codes` keeps each alive, so its id stays its own.
            key: List[Any] = [names.get(ident) or f"Thread-{ident}"]
            append = key.append
            current: Optional[FrameType] = frame
            for _ in depths:
                if current is None:
                    break
                append(id(current.f_code))
                append(current.f_lasti if offsets else current.f_lineno)
                current = current.f_back
            else:
                if current is not None:
                    append(0)  # no code object has id 0: the marker of frames cut
                    append(0)
                    self.deep += 1
            stack = tuple(key)
            if stack in counts:
                counts[stack] += 1
            elif len(counts) < MAX_STACKS:
                counts[stack] = 1
                self._keep_codes(frame)
            else:
                self.overflow[key[0]] = self.overflow.get(key[0], 0) + 1

    def _keep_codes(self, frame: Optional[FrameType]) -> None:
        """The code objects of a stack seen for the first time, kept so that their ids stay theirs."""
        codes = self.codes
        for _ in range(MAX_DEPTH):
            if frame is None:
                return
            codes.setdefault(id(frame.f_code), frame.f_code)
            frame = frame.f_back

    def result(self, wall_s: float, rate: float, ended: str) -> Dict[str, Any]:
        """The counted stacks with a frame table: `frames` [function, file, line] each, `stacks`
        [count, thread, [frame index, ...] root to leaf] each."""
        frames: List[List[Any]] = []
        index: Dict[Tuple[int, int], int] = {}
        described: Dict[Tuple[Any, ...], int] = {}  # [function, file, line] -> its frame index
        merged: Dict[Tuple[Any, ...], int] = {}  # offsets on one line make one stack
        for key, count in self.counts.items():
            path: List[int] = []
            for position in range(len(key) - 2, 0, -2):  # outermost frame first
                code_id, where = key[position], key[position + 1]
                at = index.get((code_id, where))
                if at is None:
                    frame = _describe(self.codes.get(code_id), where)
                    at = described.get(tuple(frame))
                    if at is None:
                        at = described[tuple(frame)] = len(frames)
                        frames.append(frame)
                    index[(code_id, where)] = at
                path.append(at)
            stack = (key[0], *path)
            merged[stack] = merged.get(stack, 0) + count
        stacks: List[List[Any]] = [[count, stack[0], list(stack[1:])] for stack, count in merged.items()]
        notes: List[str] = []
        for thread, count in self.overflow.items():
            at = described.get(("<stacks past the cap>", "", 0))
            if at is None:
                at = described[("<stacks past the cap>", "", 0)] = len(frames)
                frames.append(["<stacks past the cap>", "", 0])
            stacks.append([count, thread, [at]])
        if self.overflow:
            notes.append(
                f"more than {MAX_STACKS} distinct stacks: {sum(self.overflow.values())} thread samples "
                "past the cap are counted as '<stacks past the cap>'"
            )
        if self.deep:
            notes.append(
                f"{self.deep} thread samples were deeper than {MAX_DEPTH} frames: their outermost "
                "frames are shown as '<frames cut>'"
            )
        return {
            "frames": frames,
            "stacks": stacks,
            "samples": self.samples,
            "duration_s": round(wall_s, 3),
            "requested_rate_hz": rate,
            "rate_hz": round(self.samples / wall_s, 2) if wall_s > 0 else 0.0,
            "sampling_s": round(self.cost_s, 6),
            "cost_share": round(self.cost_s / wall_s, 6) if wall_s > 0 else 0.0,
            "ended": ended,
            "notes": notes,
        }


def _line_at(code: CodeType, offset: int) -> int:
    for start, end, line in code.co_lines():  # type: ignore[attr-defined,unused-ignore]
        if start <= offset < end and line is not None:
            return int(line)
    return code.co_firstlineno


def _describe(code: Optional[CodeType], where: int) -> List[Any]:
    """[function, file, line] of a frame; `where` is its instruction offset (OFFSETS) or line."""
    if code is None:
        return ["<frames cut>", "", 0]
    line = _line_at(code, where) if OFFSETS else where
    # co_qualname (3.11+) is what py-spy shows: Thread.run rather than run.
    return [getattr(code, "co_qualname", code.co_name), code.co_filename, line]


def next_interval(rate: float, cost_s: float) -> float:
    """Seconds from one sample to the next: 1/rate, or longer when a sample costs more than
    COST_SHARE of it. `cost_s` is the recent cost of a sample (smoothed)."""
    return max(1.0 / rate, cost_s / COST_SHARE)


def sample_stacks(
    exclude: Set[int], duration: float, rate: float, client_gone: Callable[[], bool]
) -> Dict[str, Any]:
    """Sample every thread but `exclude` for `duration` seconds at up to `rate` per second."""
    if not _busy.acquire(blocking=False):
        raise RequestError(
            ErrorKind.BUSY, "another flame graph is being sampled in this process; try when it ends"
        )
    try:
        _cancel.clear()
        on_stop(cancel)  # registering again changes nothing; stop hooks run once, then are forgotten
        sampling = Sampling(exclude)
        started = time.monotonic()
        end = started + duration
        checked = started
        smoothed = 0.0
        wake = started
        ended = "done"
        while True:
            spent = sampling.sample()
            # The mean of recent samples: one slow sample (a page fault) must not stall the rest.
            smoothed = spent if smoothed == 0.0 else 0.8 * smoothed + 0.2 * spent
            now = time.monotonic()
            # Kept on a schedule: the wait for the GIL after each wake-up (up to a switch
            # interval, 5 ms, behind a busy thread) is not added to every interval, but a late
            # sample is never followed by a burst of catching up.
            wake = max(wake + next_interval(rate, smoothed), now)
            wake = min(end, wake)
            if now - checked >= CLIENT_CHECK_S:
                checked = now
                if client_gone():
                    ended = "client gone"
                    break
            if _cancel.wait(max(0.0, wake - time.monotonic())):
                ended = "agent stopping"
                break
            if time.monotonic() >= end:
                break
        return sampling.result(time.monotonic() - started, rate, ended)
    finally:
        _busy.release()


def encode(result: Dict[str, Any]) -> bytes:
    """The answer as JSON for the reply's payload (the header is capped at 1 MB)."""
    return json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")
