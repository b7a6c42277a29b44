"""Which rank slows a job that is slow, not stuck: from each rank's arrivals at the collectives of
a window (when it enqueued each one: python.collectives' time_created, the job's own Flight
Recorder) and its sampled stacks. Pure functions: no I/O, no processes.

Arrivals. A collective (a process group's sequence number) cannot complete before its last rank
arrives, so the ranks that arrive first wait for the last one. A rank's lateness at a collective
is its arrival less the first rank's; its delay is its median lateness less the smallest median
lateness of any rank (the timing noise every rank has). A straggler is a rank whose delay is at
least LATE_FLOOR_S and LATE_SHARE_OF_STEP of the step (and, among NOISE_RANKS or more,
NOISE_FACTOR times the median rank's delay), and that is late by that much at LATE_MAJORITY of
the collectives at least; stragglers are named in order of delay. DDP's
all_reduce evens the ranks' step times out: every rank's step is as slow as the slowest, so the
step tells nothing; the arrivals do.

Steps. The collectives of a training loop repeat with the step: the period is the smallest count
of collectives after which the same ops of the same sizes come again (one per step for a model
whose DDP gradients fit one bucket); a rank's step is the median time between its arrivals a
period apart. Its waiting is the time from each arrival to the collective's last arrival
(overlapping waits counted once), per step; computing is the rest of the step.

Phases. Where the straggler spends the time the others wait: each stack sample of the thread
that issues the collectives is put in a phase by its outermost marker frame (torch's DataLoader,
a module's call, autograd's backward, an optimizer's step; anything else is the loop's own code),
and the phase where its share of samples exceeds the other ranks' the most is the one its extra
time goes to, named with the job's own frame that gains the most there.

Hung. When some rank has waited in a collective for STUCK_WAIT_S, and for STUCK_STEPS of the
steps the window showed, the job is stuck, not slow: `hang` is the command for that.
"""

from __future__ import annotations

import statistics
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

# A rank is late when it arrives this much after the others at least, and this share of a step,
# and, in a job of NOISE_RANKS or more, NOISE_FACTOR times the typical rank's delay (the
# scheduling noise of a loaded node: 256 ranks waking at once on 2 cores spread over 60 ms).
LATE_FLOOR_S = 0.003
LATE_SHARE_OF_STEP = 0.05
NOISE_RANKS = 8
NOISE_FACTOR = 4.0
# ... at this share of the collectives compared at least.
LATE_MAJORITY = 0.75
# Collectives of one window compared at least before any rank is judged.
MIN_COMPARED = 5
# Periods tried, and the share of collectives that must repeat a period later to take it.
MAX_PERIOD = 64
PERIOD_MATCH = 0.9
# A collective some rank has waited in this long (and STUCK_STEPS steps, where the window showed
# steps) makes the job stuck rather than slow: a slow rank's peers wait for it less than a step.
STUCK_WAIT_S = 1.0
STUCK_STEPS = 5

# Phase names, as said in the verdict; OWN_CODE when no marker frame is on the stack.
DATA, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVE, OWN_CODE = (
    "data loading", "forward", "backward", "optimizer step", "a collective", "the loop's own code",
)  # fmt: skip
# (phase, file as short_file names it, function names or None for any): outermost match wins.
PHASE_MARKERS: Tuple[Tuple[str, str, Optional[Tuple[str, ...]]], ...] = (
    (DATA, "torch/utils/data/", None),
    (FORWARD, "torch/nn/modules/module.py", ("Module._call_impl", "Module._wrapped_call_impl")),
    (BACKWARD, "torch/autograd/", None),
    (BACKWARD, "torch/_tensor.py", ("Tensor.backward",)),
    (OPTIMIZER, "torch/optim/", None),
    (COLLECTIVE, "torch/distributed/", None),
)

Stack = Tuple[Tuple[str, ...], float]  # frames root to leaf (the thread's name first), samples
Key = Tuple[str, int]  # a collective: its process group and sequence number


class Arrival(NamedTuple):
    pg_id: str
    seq: int
    op: str
    sizes: str  # input_sizes, as JSON text
    at: float  # epoch seconds it was enqueued
    pending: bool  # not completed when read


ByRank = Dict[int, Dict[Key, Arrival]]  # each rank's arrivals by collective


class RankWatched(NamedTuple):
    """What one rank showed over the window: the input of `judge`, one per rank."""

    rank: int
    node: Optional[int]
    arrivals: Optional[List[Arrival]]  # None: its collectives could not be read
    stacks: Optional[List[Stack]]  # None: its stacks could not be sampled
    carrier: str = "MainThread"  # the thread that issues its collectives
    missing_reason: str = ""  # why it gave nothing at all


class RankTiming(NamedTuple):
    rank: int
    node: Optional[int]
    step_s: Optional[float]
    computing_s: Optional[float]
    waiting_s: Optional[float]
    last_share: float  # of the collectives compared, those it arrived at last
    delay_s: float  # median lateness, less the timing noise every rank has
    late_share: float  # of the collectives compared, those it was late to
    samples: int  # stack samples of its carrier thread


class Straggler(NamedTuple):
    rank: int
    delay_s: float
    late_share: float
    job_share: float  # of the step, what the job waits for it
    phase: Optional[str]  # where its extra time goes; None: its stacks were not sampled
    frame: Optional[str]  # the job's own frame that gains the most there
    phase_extra_s: Optional[float]  # per step, beyond the other ranks' time in that phase


class Stuck(NamedTuple):
    """The collective the job is stuck in: who waits in it, who never arrived."""

    op: str
    pg_id: str
    seq: int
    waiting: List[int]
    behind: List[int]
    waited_s: float
    where: Dict[int, str]  # each rank behind: the job's own frame its samples found most


class Verdict(NamedTuple):
    ranks: List[RankTiming]
    stragglers: List[Straggler]
    compared: int  # collectives every rank of the group arrived at in the window
    op: str  # the op most compared, for the verdict's words
    pg_id: Optional[str]
    step_s: Optional[float]
    period: int  # collectives per step
    stuck: Optional[Stuck]
    missing: List[Tuple[int, str]]  # ranks that gave nothing, and why
    window_s: float
    floor_s: float = LATE_FLOOR_S  # the delay a straggler has at least, in this job


def judge(watched: Sequence[RankWatched], window: Tuple[float, float]) -> Verdict:
    """The job's verdict from what each rank showed over `window` (start, end, epoch seconds)."""
    missing = [(view.rank, view.missing_reason) for view in watched if view.arrivals is None]
    present = [view for view in watched if view.arrivals is not None]
    start, end = window
    group = _main_group(present, window)
    keys, arrivals = _compared(present, group, window)
    if len(keys) < MIN_COMPARED:
        stuck = _stuck(present, end, STUCK_WAIT_S)
        timings = [_no_timing(view) for view in present]
        op = _most_common([a.op for view in present for a in view.arrivals or [] if a.pg_id == group])
        return Verdict(timings, [], len(keys), op, group, None, 1, stuck, missing, end - start)
    ordered = sorted(keys)
    period = find_period([arrivals[present[0].rank][key] for key in ordered])
    lateness = _lateness(present, ordered, arrivals)
    timings = [_timing(view, period, lateness) for view in present]
    steps = [timing.step_s for timing in timings if timing.step_s is not None]
    step_s = statistics.median(steps) if steps else None
    # Stuck since the window's collectives: one has waited STUCK_STEPS steps at least.
    stuck = _stuck(present, end, max(STUCK_WAIT_S, STUCK_STEPS * (step_s or 0.0)))
    if stuck is not None:
        op = op_of(arrivals, present, ordered)
        return Verdict(timings, [], len(keys), op, group, step_s, period, stuck, missing, end - start)
    floor = max(LATE_FLOOR_S, LATE_SHARE_OF_STEP * (step_s or 0.0), _noise_floor(lateness))
    late = {view.rank: _late_share(view.rank, lateness, floor) for view in present}
    timings = [timing._replace(late_share=late[timing.rank]) for timing in timings]
    named = [t for t in timings if t.delay_s >= floor and t.late_share >= LATE_MAJORITY]
    named.sort(key=lambda timing: -timing.delay_s)
    culprits = {timing.rank for timing in named}
    by_rank = {view.rank: view for view in present}
    pack = [view for view in present if view.rank not in culprits]
    stragglers = [_straggler(timing, by_rank[timing.rank], pack, step_s) for timing in named]
    op = op_of(arrivals, present, ordered)
    return Verdict(
        timings, stragglers, len(keys), op, group, step_s, period, None, missing, end - start, floor
    )  # fmt: skip


def op_of(arrivals: ByRank, present: Sequence[RankWatched], keys: Sequence[Key]) -> str:
    """The op most of the collectives compared are, for the verdict's words."""
    return _most_common([arrivals[present[0].rank][key].op for key in keys])


def _main_group(present: Sequence[RankWatched], window: Tuple[float, float]) -> Optional[str]:
    """The process group with the most collectives in the window (the default group, usually)."""
    counts: Dict[str, int] = {}
    for view in present:
        for arrival in view.arrivals or []:
            if window[0] <= arrival.at <= window[1]:
                counts[arrival.pg_id] = counts.get(arrival.pg_id, 0) + 1
    return max(sorted(counts), key=lambda pg: counts[pg]) if counts else None


def _compared(
    present: Sequence[RankWatched], group: Optional[str], window: Tuple[float, float]
) -> Tuple[Set[Key], ByRank]:
    """The collectives of `group` in the window that every rank watched arrived at, and each
    rank's arrivals by (group, seq)."""
    arrivals = {
        view.rank: {
            (a.pg_id, a.seq): a
            for a in view.arrivals or []
            if a.pg_id == group and window[0] <= a.at <= window[1]
        }
        for view in present
    }
    keys: Optional[Set[Key]] = None
    for by_key in arrivals.values():
        keys = set(by_key) if keys is None else keys & set(by_key)
    if len(present) < 2:
        keys = set()
    return keys or set(), arrivals


def find_period(calls: Sequence[Arrival]) -> int:
    """The smallest number of collectives after which the same ops of the same sizes repeat."""
    signatures = [(call.op, call.sizes) for call in calls]
    for period in range(1, min(MAX_PERIOD, len(signatures) // 3) + 1):
        pairs = len(signatures) - period
        same = sum(signatures[i] == signatures[i + period] for i in range(pairs))
        if same >= PERIOD_MATCH * pairs:
            return period
    return 1


class _Lateness(NamedTuple):
    times: Dict[int, List[float]]  # each rank's arrivals at the collectives compared, in order
    firsts: List[float]  # each collective's first arrival
    lasts: List[float]  # and its last
    noise: float  # the smallest median lateness of any rank
    delays: Dict[int, float]  # each rank's median lateness, less the noise


def _lateness(present: Sequence[RankWatched], keys: Sequence[Key], arrivals: ByRank) -> _Lateness:
    times = {view.rank: [arrivals[view.rank][key].at for key in keys] for view in present}
    columns = list(zip(*times.values()))  # a collective's arrivals: min and max run in C
    firsts, lasts = [min(column) for column in columns], [max(column) for column in columns]
    medians = {rank: statistics.median(map(float.__sub__, own, firsts)) for rank, own in times.items()}
    noise = min(medians.values())
    return _Lateness(times, firsts, lasts, noise, {rank: median - noise for rank, median in medians.items()})


def _noise_floor(lateness: _Lateness) -> float:
    """NOISE_FACTOR times the median rank's delay, where there are enough ranks to tell the
    typical rank (in a job of 4, two stragglers would be half of it)."""
    delays = list(lateness.delays.values())
    return NOISE_FACTOR * statistics.median(delays) if len(delays) >= NOISE_RANKS else 0.0


def _late_share(rank: int, lateness: _Lateness, floor: float) -> float:
    """The share of the collectives `rank` arrived at `floor` or more later than the noise allows."""
    own, firsts = lateness.times[rank], lateness.firsts
    late = sum(at - first - lateness.noise >= floor for at, first in zip(own, firsts))
    return late / len(own)


def _timing(view: RankWatched, period: int, lateness: _Lateness) -> RankTiming:
    own = lateness.times[view.rank]
    gaps = [own[i + period] - own[i] for i in range(len(own) - period)]
    step = statistics.median(gaps) if gaps else None
    lasts = lateness.lasts
    last_count = sum(at >= last for at, last in zip(own, lasts))
    waiting = _covered(list(zip(own, lasts))) / max(1.0, len(own) / period)
    computing = None if step is None else max(0.0, step - waiting)
    samples = int(sum(weight for frames, weight in view.stacks or [] if frames and frames[0] == view.carrier))
    return RankTiming(
        view.rank, view.node, step, computing, None if step is None else min(waiting, step),
        last_count / len(own), lateness.delays[view.rank], 0.0, samples,
    )  # fmt: skip


def _covered(intervals: List[Tuple[float, float]]) -> float:
    """The time the intervals cover, overlaps counted once."""
    total, reached = 0.0, float("-inf")
    for begin, finish in sorted(intervals):
        begin = max(begin, reached)
        if finish > begin:
            total += finish - begin
            reached = finish
    return total


def _no_timing(view: RankWatched) -> RankTiming:
    samples = int(sum(weight for frames, weight in view.stacks or [] if frames and frames[0] == view.carrier))
    return RankTiming(view.rank, view.node, None, None, None, 0.0, 0.0, 0.0, samples)


def _stuck(present: Sequence[RankWatched], end: float, wait_s: float) -> Optional[Stuck]:
    """The oldest collective some rank has waited in `wait_s` or more, with the ranks waiting in
    it and those of the ranks watched that never arrived; None when none waits that long."""
    pending = [
        (arrival, view.rank) for view in present for arrival in view.arrivals or []
        if arrival.pending and end - arrival.at >= wait_s
    ]  # fmt: skip
    if not pending:
        return None
    oldest, _ = min(pending, key=lambda pair: (pair[0].at, pair[0].seq))
    key = (oldest.pg_id, oldest.seq)
    waiting = sorted({rank for arrival, rank in pending if (arrival.pg_id, arrival.seq) == key})
    reached = {view.rank for view in present for a in view.arrivals or [] if (a.pg_id, a.seq) == key}
    behind = sorted(view.rank for view in present if view.rank not in reached)
    where = {view.rank: _most_sampled(view) for view in present if view.rank in behind}
    places = {rank: frame for rank, frame in where.items() if frame is not None}
    return Stuck(oldest.op, oldest.pg_id, oldest.seq, waiting, behind, end - oldest.at, places)


def _most_sampled(view: RankWatched) -> Optional[str]:
    """The job's own frame (else the innermost) the carrier thread's samples found most."""
    counts: Dict[str, float] = {}
    for stack, weight in view.stacks or []:
        if len(stack) > 1 and stack[0] == view.carrier:
            frame = own_frame(stack[1:]) or stack[-1]
            counts[frame] = counts.get(frame, 0.0) + weight
    return max(sorted(counts), key=lambda frame: counts[frame]) if counts else None


def phase_of(frames: Sequence[str]) -> str:
    """The phase of a stack (frames root to leaf, as `function (file:line)`): its outermost marker."""
    for frame in frames:
        for phase, file, functions in PHASE_MARKERS:
            if f"({file}" in frame and (functions is None or frame.split(" (", 1)[0] in functions):
                return phase
    return OWN_CODE


def own_frame(frames: Sequence[str]) -> Optional[str]:
    """The innermost frame of the job's own code: not in an installed package nor the standard
    library (whose files short_file names as `package/file.py` and `name.py`)."""
    for frame in reversed(frames):
        file = frame.rsplit(" (", 1)[-1]
        if "/" in file or not file.endswith(")") or ":" not in file:
            continue
        module = file.split(".py:", 1)[0]
        if module not in _STANDARD_LIBRARY:
            return frame
    return None


_STANDARD_LIBRARY: Set[str] = set(getattr(sys, "stdlib_module_names", ()))


def _phase_shares(view: RankWatched) -> Tuple[Dict[str, float], Dict[Tuple[str, Optional[str]], float]]:
    """The share of the carrier thread's samples in each phase, and in each (phase, own frame)."""
    phases: Dict[str, float] = {}
    frames: Dict[Tuple[str, Optional[str]], float] = {}
    total = 0.0
    for stack, weight in view.stacks or []:
        if not stack or stack[0] != view.carrier:
            continue
        phase = phase_of(stack[1:])
        phases[phase] = phases.get(phase, 0.0) + weight
        key = (phase, own_frame(stack[1:]))
        frames[key] = frames.get(key, 0.0) + weight
        total += weight
    if not total:
        return {}, {}
    return ({k: v / total for k, v in phases.items()}, {k: v / total for k, v in frames.items()})


def _straggler(
    timing: RankTiming, view: RankWatched, pack: Sequence[RankWatched], step_s: Optional[float]
) -> Straggler:
    job_share = min(1.0, timing.delay_s / step_s) if step_s else 0.0
    own_phases, own_frames = _phase_shares(view)
    others = [_phase_shares(each) for each in pack if each.stacks]
    if not own_phases or not others or not step_s:
        return Straggler(timing.rank, timing.delay_s, timing.late_share, job_share, None, None, None)
    extra = {
        phase: share - statistics.mean(phases.get(phase, 0.0) for phases, _ in others)
        for phase, share in own_phases.items()
    }
    phase = max(sorted(extra), key=lambda name: extra[name])
    gained = {
        key: share - statistics.mean(frames.get(key, 0.0) for _, frames in others)
        for key, share in own_frames.items()
        if key[0] == phase
    }
    best = max(sorted(gained, key=str), key=lambda key: gained[key])
    return Straggler(
        timing.rank, timing.delay_s, timing.late_share, job_share, phase, best[1], extra[phase] * step_s
    )


def _most_common(values: Sequence[str]) -> str:
    counts: Dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return max(sorted(counts), key=lambda value: counts[value]) if counts else "collective"
