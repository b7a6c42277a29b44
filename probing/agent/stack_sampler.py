"""`flamegraph`: the stacks of every thread of the job, sampled for a while and counted.

The sampler runs in the connection thread that serves the request (an AgentThread: no tracer,
in the agent's own threads, which are left out of what it counts). Each sample takes the GIL
from the job for as long as `sys._current_frames()` and the walk of its frames take, so that
time is measured around every sample and the interval is stretched until the samples take at
most SAMPLES_SHARE of the wall time, at most the requested rate (py-spy's 100 Hz by default).
Everything the sampling costs the job is counted in the share it reports (`cost_share`): the
samples, the reading of thread names, the building and encoding of the answer; a sample is
skipped when it, and what it adds to the answer, would take the whole past COST_SHARE of
the window, the first one too (its cost is estimated from the number of threads), and a
sample that runs past its share is given up half-way (a walk of 1000 deep stacks can take
100 ms). The answer is built and encoded in
chunks, letting other threads run between them (sleep(0)), so no one step of it holds
the GIL for long. What can still pass 0.5 %: the switch to this thread each time it wakes (not
measurable from inside), and an answer that takes more than the share kept for it (many
distinct deep stacks); the reported share then says so. Only code objects, offsets and
thread names are read (from the interpreter's own fields: no property of a Thread subclass
runs): never a local, never tensor data.

What is kept is bounded: MAX_STACKS distinct stacks (the rest are counted under one "stacks
past the cap" entry per thread) of at most MAX_DEPTH frames each (deeper stacks keep their
innermost frames, under a marker). One sampling runs at a time per agent; it ends early when
the client goes away or the agent stops.
"""

from __future__ import annotations

import bisect
import os
import time
from types import CodeType, FrameType
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..originals import Event, allocate_lock, json_dumps, monotonic, perf_counter, sleep
from .lifecycle import on_stop
from .requests import ErrorKind, RequestError
from .stacks import current_frames, leaving, thread_names

# The share of wall time the sampler may hold the GIL: half of the 1 % the job may lose.
COST_SHARE = 0.005
# The share the samples are paced to: the rest of COST_SHARE is kept for building the answer.
SAMPLES_SHARE = 0.004
# What a sample is assumed to cost per thread before one was measured: a 64-frame walk at
# 1 us a frame (measured: 0.6-0.9 us a frame on a loaded 2-core machine).
FIRST_SAMPLE_S_PER_THREAD = 64e-6
# How much of the answer is made between two chances for the job's threads to take the GIL.
ANSWER_CHUNK = 256
# What the answer is assumed to cost per frame of a distinct stack (measured: 0.6 us on a
# 2-core machine): a sample that finds new stacks adds to the answer up to twice its own walk.
ANSWER_S_PER_FRAME = 1e-6
# And what any answer costs (measured: 120-260 us on a loaded 2-core machine).
ANSWER_BASE_S = 400e-6
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

_busy = allocate_lock()
_cancel = Event()

# A stack as counted: the thread's name, then (id of code, line) pairs innermost first; a
# code id of 0 stands for frames cut by MAX_DEPTH.
StackKey = Tuple[Any, ...]


def cancel() -> None:
    """End a sampling now (a stop hook: the agent is stopping)."""
    _cancel.set()


def _after_fork_in_child() -> None:
    # A child forked mid-sampling has no sampler thread: its lock must not stay taken.
    global _busy, _cancel
    _busy, _cancel = allocate_lock(), Event()


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
        self.skipped = 0  # samples left out: they would have cost more than the budget
        self.abandoned = 0  # samples begun and given up: they took longer than the budget left
        self.misread = 0  # of those, the ones whose walk met something that is no frame
        self.new_frames = 0  # frames of the distinct stacks: what the answer will cost
        self.threads = 0

    def _refresh_names(self, now: float) -> None:
        self.names = thread_names()
        self.names_at = now

    def sample(self, limit_s: float = float("inf")) -> float:
        """Take one sample; the seconds it held the GIL. A sample that has taken `limit_s` is
        abandoned where it is (nothing of it counted): the budget bounds even a 1000-thread walk."""
        started = perf_counter()
        if started - self.names_at >= NAMES_EVERY_S:
            self._refresh_names(started)
        # In a function of its own: no reference to a frame (nor to its locals) outlives it.
        try:
            counted = self._count_all(started + limit_s)
        except AttributeError:
            # A walk met something that is no frame: once in CI, on 3.11, a torch job's frame
            # chain gave a dict ('dict' object has no attribute 'f_code'), which failed the whole
            # sampling. Such a sample is given up (nothing of it counted) and the answer says so.
            counted = False
            self.misread += 1
        if counted:
            self.samples += 1
        else:
            self.abandoned += 1
        spent = perf_counter() - started
        self.cost_s += spent
        return spent

    def _count_all(self, deadline: float) -> bool:
        """Walk every thread's stack, then count them; False (nothing counted) past `deadline`."""
        names, exclude = self.names, self.exclude
        depths, offsets = range(MAX_DEPTH), OFFSETS  # locals: read for every frame
        clock = time.perf_counter
        walked: List[Tuple[StackKey, FrameType]] = []
        deep = 0
        for ident, frame in current_frames().items():
            if ident in exclude or ident in leaving:
                continue
            if len(walked) % 16 == 15 and clock() > deadline:
                return False
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
                    deep += 1
            walked.append((tuple(key), frame))
        counts = self.counts
        self.deep += deep
        for stack, frame in walked:
            if stack in counts:
                counts[stack] += 1
            elif len(counts) < MAX_STACKS:
                counts[stack] = 1
                self.new_frames += len(stack) // 2
                self._keep_codes(frame)
            else:
                self.overflow[stack[0]] = self.overflow.get(stack[0], 0) + 1
        return True

    def _keep_codes(self, frame: Optional[FrameType]) -> None:
        """The code objects of a stack seen for the first time, kept so that their ids stay theirs."""
        codes = self.codes
        for _ in range(MAX_DEPTH):
            if type(frame) is not FrameType:  # None, or no frame (sample() says why that is)
                return
            codes.setdefault(id(frame.f_code), frame.f_code)
            frame = frame.f_back

    def result(self, started: float, rate: float, ended: str) -> bytes:
        """The answer, encoded: `frames` [function, file, line] each, `stacks` [count, thread,
        [frame index, ...] root to leaf] each, and the figures, `cost_share` counting the time
        spent here. `started` is the monotonic() the sampling began."""
        building = perf_counter()
        frames, stacks, building = self._frames_and_stacks(building)
        notes = self._notes()
        # Encoded in pieces: json.dumps of a whole 8 MB answer is one C call that never lets go.
        parts: List[bytes] = [b'{"frames":[']
        for at in range(0, len(frames), ANSWER_CHUNK * 8):
            building = self._let_others_run(building)
            parts.append((b"," if at else b"") + _dumps(frames[at : at + ANSWER_CHUNK * 8])[1:-1])
        parts.append(b'],"stacks":[')
        for at in range(0, len(stacks), ANSWER_CHUNK * 4):
            building = self._let_others_run(building)
            parts.append((b"," if at else b"") + _dumps(stacks[at : at + ANSWER_CHUNK * 4])[1:-1])
        self.cost_s += perf_counter() - building
        wall_s = monotonic() - started
        figures = {
            "samples": self.samples,
            "duration_s": round(wall_s, 3),
            "requested_rate_hz": rate,
            "rate_hz": round(self.samples / wall_s, 2) if wall_s > 0 else 0.0,
            "sampling_s": round(self.cost_s, 6),
            "cost_share": round(self.cost_s / wall_s, 6) if wall_s > 0 else 0.0,
            "ended": ended,
            "notes": notes,
        }
        parts.append(b"]," + _dumps(figures)[1:])
        return b"".join(parts)

    def _frames_and_stacks(self, building: float) -> Tuple[List[List[Any]], List[List[Any]], float]:
        """The counted stacks as a table of frames and stacks of indexes into it (the samples
        past the cap as one frame of their own), letting the job run between chunks; and when
        the time held was last counted (`building`, as _let_others_run returns it)."""
        frames: List[List[Any]] = []
        index: Dict[Tuple[int, int], int] = {}
        described: Dict[Tuple[Any, ...], int] = {}  # [function, file, line] -> its frame index
        merged: Dict[Tuple[Any, ...], int] = {}  # offsets on one line make one stack
        lines: Dict[int, Tuple[List[int], List[Tuple[int, int]]]] = {}  # per code: its line table
        for made, (key, count) in enumerate(self.counts.items()):
            if made % ANSWER_CHUNK == ANSWER_CHUNK - 1:
                building = self._let_others_run(building)
            path: List[int] = []
            for position in range(len(key) - 2, 0, -2):  # outermost frame first
                code_id, where = key[position], key[position + 1]
                at = index.get((code_id, where))
                if at is None:
                    frame = _describe(self.codes.get(code_id), where, lines)
                    at = described.get(tuple(frame))
                    if at is None:
                        at = described[tuple(frame)] = len(frames)
                        frames.append(frame)
                    index[(code_id, where)] = at
                path.append(at)
            stack = (key[0], *path)
            merged[stack] = merged.get(stack, 0) + count
        stacks: List[List[Any]] = [[count, stack[0], list(stack[1:])] for stack, count in merged.items()]
        for thread, count in self.overflow.items():
            at = described.get(("<stacks past the cap>", "", 0))
            if at is None:
                at = described[("<stacks past the cap>", "", 0)] = len(frames)
                frames.append(["<stacks past the cap>", "", 0])
            stacks.append([count, thread, [at]])
        return frames, stacks, building

    def _notes(self) -> List[str]:
        """What the answer leaves out or cuts, and why."""
        # What a user can do when the budget left few samples: sample from outside, no GIL needed.
        outside = "; `flamegraph --outside` samples with py-spy, which needs no GIL"
        past_cap, half_way = sum(self.overflow.values()), self.abandoned - self.misread
        said = [
            (past_cap, f"more than {MAX_STACKS} distinct stacks: {past_cap} thread samples past the "
             "cap are counted as '<stacks past the cap>'"),
            (self.deep, f"{self.deep} thread samples were deeper than {MAX_DEPTH} frames: their "
             "outermost frames are shown as '<frames cut>'"),
            (half_way, f"{_samples(half_way)} given up half-way: they took longer than the "
             f"{COST_SHARE:.1%} of the time left them ({self.threads} threads){outside}"),
            (self.misread, f"{_samples(self.misread)} given up: a thread's frames read as something "
             "that is no frame (a stack changing under the walk)"),
            (self.skipped, f"{_samples(self.skipped)} left out: with the answer they would have held "
             f"the GIL more than {COST_SHARE:.1%} of the time ({self.threads} threads){outside}"),
        ]  # fmt: skip
        return [text for count, text in said if count > 0]

    def _let_others_run(self, since: float) -> float:
        """Count the time held since `since`, let the job's threads take the GIL; now."""
        self.cost_s += perf_counter() - since
        sleep(0)
        return perf_counter()


def _line_at(code: CodeType, offset: int, lines: Dict[int, Tuple[List[int], List[Tuple[int, int]]]]) -> int:
    """The line of instruction `offset`, from the code's line table read once (`lines` caches
    it per code: a big generated function has thousands of offsets sampled)."""
    table = lines.get(id(code))
    if table is None:
        starts: List[int] = []
        spans: List[Tuple[int, int]] = []
        for start, end, line in code.co_lines():  # type: ignore[attr-defined,unused-ignore]
            if line is not None:
                starts.append(start)
                spans.append((end, int(line)))
        table = lines[id(code)] = (starts, spans)
    at = bisect.bisect_right(table[0], offset) - 1
    if at >= 0 and offset < table[1][at][0]:
        return table[1][at][1]
    return code.co_firstlineno


def _describe(
    code: Optional[CodeType], where: int, lines: Dict[int, Tuple[List[int], List[Tuple[int, int]]]]
) -> List[Any]:
    """[function, file, line] of a frame; `where` is its instruction offset (OFFSETS) or line."""
    if code is None:
        return ["<frames cut>", "", 0]
    line = _line_at(code, where, lines) if OFFSETS else where
    # co_qualname (3.11+) is what py-spy shows: Thread.run rather than run.
    return [getattr(code, "co_qualname", code.co_name), code.co_filename, line]


class Jitter:
    """Factors in [0.5, 1.5) that spread the samples' intervals around their mean: samples at a
    fixed interval alias with a job's fixed step (2 a second over a 1-second step land on the same
    two moments of it every time, and miss what the step does elsewhere). A linear congruential
    generator: the agent imports no `random` into the job."""

    def __init__(self, seed: int) -> None:
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def next(self) -> float:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return 0.5 + (self.state >> 11) / float(1 << 53)


def next_interval(rate: float, cost_s: float) -> float:
    """Seconds from one sample to the next: 1/rate, or longer when a sample costs more than
    SAMPLES_SHARE of it. `cost_s` is the recent cost of a sample (smoothed)."""
    return max(1.0 / rate, cost_s / SAMPLES_SHARE)


def _samples(count: int) -> str:
    return "1 sample was" if count == 1 else f"{count} samples were"


def _dumps(value: Any) -> bytes:
    # ASCII: a name with a lone surrogate (a file name of bytes that are not UTF-8) stays
    # valid JSON (\udcxx), and the C encoder's ASCII path is the faster one.
    return json_dumps(value, compact=True).encode("ascii")


def sample_stacks(exclude: Set[int], duration: float, rate: float, client_gone: Callable[[], bool]) -> bytes:
    """Sample every thread but `exclude` for `duration` seconds at up to `rate` per second;
    the answer encoded (see Sampling.result)."""
    if not _busy.acquire(blocking=False):
        raise RequestError(
            ErrorKind.BUSY, "another flame graph is being sampled in this process; try when it ends"
        )
    try:
        _cancel.clear()
        on_stop(cancel)  # registering again changes nothing; stop hooks run once, then are forgotten
        sampling = Sampling(exclude)
        started = monotonic()
        end = started + duration
        checked = started
        counting = perf_counter()
        sampling.threads = len(current_frames())
        smoothed = sampling.threads * FIRST_SAMPLE_S_PER_THREAD
        sampling.cost_s += perf_counter() - counting
        budget = COST_SHARE * duration
        wake = started
        jitter = Jitter(int(perf_counter() * 1e9) ^ os.getpid())
        ended = "done"
        while True:
            # What one more sample may take: a third of what is left once the answer is paid
            # for, as new stacks add up to twice their walk to the answer.
            left = budget - sampling.cost_s - ANSWER_BASE_S - sampling.new_frames * ANSWER_S_PER_FRAME
            # The first sample is taken whenever one fits the whole budget: on a loaded machine
            # the thread count above, descheduled for a few ms, could spend it all (CI drew an
            # empty graph of an idle two-thread job).
            if not sampling.samples and not sampling.abandoned and smoothed <= (budget - ANSWER_BASE_S) / 3:
                left = max(left, budget - ANSWER_BASE_S)
            if smoothed <= left / 3:
                taken = sampling.samples
                spent = sampling.sample(left / 3)
                # The mean of recent samples: one slow sample (a page fault) must not stall the rest.
                smoothed = spent if taken == 0 else 0.8 * smoothed + 0.2 * spent
            else:
                sampling.skipped += 1
            now = monotonic()
            # Kept on a schedule: the wait for the GIL after each wake-up (up to a switch
            # interval, 5 ms, behind a busy thread) is not added to every interval, but a late
            # sample is never followed by a burst of catching up. Jittered, not periodic.
            wake = max(wake + next_interval(rate, smoothed) * jitter.next(), now)
            wake = min(end, wake)
            if now - checked >= CLIENT_CHECK_S:
                checked = now
                if client_gone():
                    ended = "client gone"
                    break
            if _cancel.wait(max(0.0, wake - monotonic())):
                ended = "agent stopping"
                break
            if monotonic() >= end:
                break
        return sampling.result(started, rate, ended)
    finally:
        _busy.release()
