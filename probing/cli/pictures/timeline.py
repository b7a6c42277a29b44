"""python.torch_trace as Chrome trace event JSON, the format Perfetto (ui.perfetto.dev) and
chrome://tracing open, the one torch.profiler writes.

What is drawn, per process (one per rank with --ranks):
- thread 1, "training thread": a span per step (from the first call's start to the last call's
  end), the forward module calls nested under it (model > model.layers > model.layers.0, the
  way they nest in time), and the optimizer steps;
- thread 2, "backward": the modules' backward passes (`trace on --backward`). Autograd runs
  them in its own order, in reverse and interleaved with the forward calls of other
  micro-batches, so under the forward spans they would read as calls the module made;
  on a track of their own they read as what they are;
- instants for NaN/Inf events on the track of their stage; counters for CUDA allocated and
  reserved (after each call, where known) and for the process's RSS (process.memory).

Times are wall-clock microseconds since the Unix epoch (the rows' `ts`), so the ranks of a job
line up as they really ran: a straggler's step starts late. Within a step a call's start is
the step's start plus its `time_offset` (perf_counter, sub-microsecond), and its end that plus
its `duration`; both are rounded to whole microseconds by one monotone rule, so a call that
lies inside another in the rows lies inside it in the file, and rounding cannot make two spans
partly overlap. A parent's backward span is stretched over a child's that the rows say began
before it (two hooks on one autograd node, see cover_children). Spans that still partly
overlap (CUDA durations are the device's, their starts the host's)
go on an extra track of the same thread ("forward 2"), never a misdrawn one: on every track
X events nest or are apart, which Perfetto needs.

Events are made one at a time as JSON text (generators), so a million rows never sit in
memory as dicts; the common span event is formatted directly, the rest through json.dumps.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from .timeline_nesting import Call, cover_children

# Column order of the rows each generator reads (engine/timeline.py selects them so).
TRACE_ROW = ("process", "step", "seq", "module", "module_type", "stage", "duration", "time_offset",
             "allocated", "max_allocated", "reserved", "ts_us")  # fmt: skip
NAN_ROW = ("process", "step", "seq", "module", "module_type", "stage", "tensor", "nan_count", "inf_count",
           "input_finite", "ts_us")  # fmt: skip
MEMORY_ROW = ("process", "ts_us", "rss_mb")

TRAINING_THREAD = "training thread"
BACKWARD_THREAD = "backward"
HINT = "open it in https://ui.perfetto.dev or chrome://tracing"
# A row whose own wall clock disagrees with its step's by more than this was stamped against
# another step's start (a backward pass that ended after the next step began): its own ts rules.
ANCHOR_SLACK_US = 2.0
US = 1_000_000.0
# Compact JSON (a million events: every space counts); NaN never reaches it (checked before).
_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=str).encode


# (start, -end, order, depth, seq, family, text before the times, text after them)
_Span = Tuple[int, int, int, int, int, str, str, str]


class ProcessTrack(NamedTuple):
    """One process of the trace: `key` as the rows' `process` column says it, `pid` the number
    the file uses, `name` what the viewer shows ("rank 1 (PID 4242)")."""

    key: int
    pid: int
    name: str


def _round(value: float) -> int:
    """Monotone rounding: x <= y gives _round(x) <= _round(y), which keeps nesting."""
    return math.floor(value + 0.5)


class _Lanes:
    """The tracks of one thread family of one process. A span goes on the first track where it
    nests inside what is open there or starts after all of it ended; else on a new track."""

    __slots__ = ("stacks", "floors", "tids")

    def __init__(self) -> None:
        self.stacks: List[List[Tuple[int, int]]] = []
        self.floors: List[int] = []  # the latest end of every span closed on the track
        self.tids: List[int] = []

    def place(self, start: int, end: int) -> int:
        """The index of the track the span [start, end] goes on (len(tids) for a new one)."""
        for index, stack in enumerate(self.stacks):
            while stack and stack[-1][1] <= start:
                self.floors[index] = max(self.floors[index], stack.pop()[1])
            if start < self.floors[index]:
                continue
            if not stack or (stack[-1][0] <= start and end <= stack[-1][1]):
                stack.append((start, end))
                return index
        self.stacks.append([(start, end)])
        self.floors.append(-(1 << 62))
        return len(self.stacks) - 1


class Timeline:
    """Makes the events of one trace file; holds the state they need (tracks opened, counters'
    last values, what was counted and skipped). Each method yields events as JSON text."""

    def __init__(self, processes: Sequence[ProcessTrack]) -> None:
        self.processes: Dict[int, ProcessTrack] = {track.key: track for track in processes}
        self.lanes: Dict[Tuple[int, str], _Lanes] = {}
        self.next_tid: Dict[int, int] = {}
        self.counters: Dict[Tuple[int, str], float] = {}
        self.strings: Dict[str, str] = {}
        self.kinds: Dict[Tuple[Any, Any, Any], Tuple[str, str, str]] = {}
        self.skipped = 0  # rows without a finite duration or offset
        self.steps = 0
        self.calls = 0

    # --- helpers -------------------------------------------------------------------------

    def _string(self, value: Any) -> str:
        """`value` as a JSON string, cached: a million calls name a few hundred modules."""
        text = "" if value is None else str(value)
        found = self.strings.get(text)
        if found is None:
            found = json.dumps(text)
            if len(self.strings) < 100_000:
                self.strings[text] = found
        return found

    def _process(self, key: int) -> Tuple[ProcessTrack, List[str]]:
        """The track of process `key`, and its metadata events when it is first seen."""
        track = self.processes.get(key)
        if track is not None and key in self.next_tid:
            return track, []
        if track is None:
            track = ProcessTrack(key, key, f"rank {key}")
            self.processes[key] = track
        self.next_tid[key] = 3  # 1 and 2: the first tracks of the training thread and backward
        events = [
            _metadata("process_name", track.pid, None, {"name": track.name}),
            _metadata("process_sort_index", track.pid, None, {"sort_index": key}),
        ]
        return track, events

    def _tid(self, key: int, pid: int, family: str, index: int, out: List[str]) -> int:
        """The thread id of track `index` of `family`, naming it in `out` when it is new."""
        lanes = self.lanes.setdefault((key, family), _Lanes())
        while len(lanes.tids) <= index:
            number = len(lanes.tids)
            if number == 0:
                tid = 1 if family == TRAINING_THREAD else 2
                name = family
            else:
                tid = self.next_tid[key]
                self.next_tid[key] = tid + 1
                name = f"{family} {number + 1}"
            lanes.tids.append(tid)
            out.append(_metadata("thread_name", pid, tid, {"name": name}))
            out.append(_metadata("thread_sort_index", pid, tid, {"sort_index": tid}))
        return lanes.tids[index]

    def _counter(self, key: int, pid: int, name: str, ts: int, value: Any, out: List[str]) -> None:
        """A counter event when the value changed (a million calls, a few hundred changes)."""
        if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        value = float(value)
        if self.counters.get((key, name)) == value:
            return
        self.counters[(key, name)] = value
        out.append(_encode({"ph": "C", "name": name, "ts": ts, "pid": pid, "tid": 1, "args": {"MB": value}}))

    # --- the events ----------------------------------------------------------------------

    def process_events(self) -> Iterator[str]:
        """Metadata naming every process given, whether or not it has rows."""
        for key in list(self.processes):
            yield from self._process(key)[1]

    def trace_events(self, rows: Iterable[Sequence[Any]]) -> Iterator[str]:
        """Spans and memory counters from python.torch_trace rows (TRACE_ROW order), sorted by
        process, step and seq: one step is held at a time."""
        for (key, step), group in itertools.groupby(rows, key=lambda row: (row[0], row[1])):
            if step is None or key is None:
                self.skipped += sum(1 for _ in group)
                continue
            yield from self._step(int(key), int(step), list(group))

    def _step(self, key: int, step: int, rows: List[Sequence[Any]]) -> Iterator[str]:
        track, out = self._process(key)
        pid = track.pid
        timed = [row for row in rows if _finite(row[6]) and _finite(row[7]) and row[11] is not None]
        self.skipped += len(rows) - len(timed)
        if not timed:
            yield from out
            return
        calls = _calls_on_wall_clock(timed)
        spans = self._spans(step, calls)
        # Yielded as made: a step of a million calls (an inference job's step 0) does not also
        # hold its million event texts.
        yield from out
        out = []
        for start, negative_end, _, _, _, family, head, tail in spans:
            lanes = self.lanes.get((key, family)) or self.lanes.setdefault((key, family), _Lanes())
            index = lanes.place(start, -negative_end)
            if index >= len(lanes.tids):
                self._tid(key, pid, family, index, out)
                yield from out
                out = []
            tid = lanes.tids[index]
            yield f'{{{head},"ts":{start},"dur":{-negative_end - start},{tail},"pid":{pid},"tid":{tid}}}'
        del spans
        for call in calls:
            if call.row[8] is not None or call.row[10] is not None:
                self._counter(key, pid, "CUDA allocated (MB)", call.end, call.row[8], out)
                self._counter(key, pid, "CUDA reserved (MB)", call.end, call.row[10], out)
        self.steps += 1
        self.calls += len(calls)
        yield from out

    def _spans(self, step: int, calls: List[Call]) -> List[_Span]:
        """The step's calls and the step itself as spans, in the order they are drawn (the step
        before the calls it covers, a caller before its callees)."""
        spans: List[_Span] = []
        for call in calls:
            row = call.row
            family, head, args = self._kind(row[3], row[4], row[5])
            seq = int(row[2] or 0)
            tail = f'{args}"step":{step},"seq":{seq},"duration_s":{float(row[6])!r}}}'
            spans.append((call.start, -call.end, 1, call.depth, seq, family, head, tail))
        first, last = min(span[0] for span in spans), -min(span[1] for span in spans)
        step_head = f'"ph":"X","name":"step {step}","cat":"step"'
        spans.append(
            (
                first,
                -last,
                0,
                -1,
                -1,
                TRAINING_THREAD,
                step_head,
                f'"args":{{"step":{step},"calls":{len(calls)}}}',
            )
        )
        spans.sort()
        return spans

    def _kind(self, module: Any, module_type: Any, stage: Any) -> Tuple[str, str, str]:
        """The thread family, the event's head (ph, name, cat) and the start of its args, for a
        call of `module` in `stage`: the same few hundred for a million rows, made once."""
        key = (module, module_type, stage)
        found = self.kinds.get(key)
        if found is None:
            family = BACKWARD_THREAD if stage == "backward" else TRAINING_THREAD
            category = stage if stage in ("forward", "backward", "optimizer") else "call"
            name = self._string(module)
            head = f'"ph":"X","name":{name},"cat":"{category}"'
            args = (
                f'"args":{{"module":{name},"module_type":{self._string(module_type)},'
                f'"stage":{self._string(stage)},'
            )
            found = (family, head, args)
            if len(self.kinds) < 100_000:
                self.kinds[key] = found
        return found

    def nan_events(self, rows: Iterable[Sequence[Any]]) -> Iterator[str]:
        """An instant per python.nan_events row (NAN_ROW order), on the track of its stage."""
        for row in rows:
            if row[10] is None:
                continue
            key = int(row[0])
            track, out = self._process(key)
            family = BACKWARD_THREAD if row[5] == "backward" else TRAINING_THREAD
            tid = self._tid(key, track.pid, family, 0, out)
            names = NAN_ROW[1:10]
            args = dict(zip(names, row[1:10]))
            event = {"ph": "i", "s": "t", "name": f"NaN/Inf in {row[3]}", "cat": "nan", "ts": int(row[10]),
                     "pid": track.pid, "tid": tid, "args": args}  # fmt: skip
            out.append(_encode(event))
            yield from out

    def memory_events(self, rows: Iterable[Sequence[Any]]) -> Iterator[str]:
        """The RSS counter from process.memory rows (MEMORY_ROW order)."""
        for row in rows:
            if row[1] is None:
                continue
            key = int(row[0])
            track, out = self._process(key)
            self._counter(key, track.pid, "RSS (MB)", int(row[1]), row[2], out)
            yield from out


def _calls_on_wall_clock(timed: List[Sequence[Any]]) -> List[Call]:
    """A step's timed rows as calls on the wall clock (microseconds), nested (cover_children)."""
    # The step's start on the wall clock, from the row that agrees best with the others.
    anchors = sorted(row[11] - row[7] * US for row in timed)
    median = anchors[len(anchors) // 2]
    reference = min(timed, key=lambda row: abs(row[11] - row[7] * US - median))
    base, base_offset = int(reference[11]), reference[7] * US
    calls: List[Call] = []
    for row in timed:
        relative = row[7] * US - base_offset
        if abs(row[11] - base - relative) > ANCHOR_SLACK_US:
            relative = float(row[11] - base)
        start = base + _round(relative)
        end = max(start, base + _round(relative + max(row[6], 0.0) * US))
        calls.append(Call(start, end, row))
    cover_children(calls)
    return calls


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _metadata(name: str, pid: int, tid: Optional[int], args: Dict[str, Any]) -> str:
    event: Dict[str, Any] = {
        "ph": "M",
        "name": name,
        "pid": pid,
        "tid": 0 if tid is None else tid,
        "args": args,
    }
    return _encode(event)


class Counted:
    """Events passed through, counted (the count is what the file holds once written)."""

    def __init__(self, events: Iterable[str]) -> None:
        self.events = events
        self.count = 0

    def __iter__(self) -> Iterator[str]:
        for event in self.events:
            self.count += 1
            yield event


def trace_document(events: Iterable[str], other_data: Dict[str, Any]) -> Iterator[str]:
    """The whole JSON object, in parts: {"traceEvents": [...], "displayTimeUnit": "ms",
    "otherData": {...}}. Parts of about 64 kB, so writing costs few calls."""
    yield '{"traceEvents":[\n'
    batch: List[str] = []
    size = 0
    first = True
    for event in events:
        if not first:
            batch.append(",\n")
        first = False
        batch.append(event)
        size += len(event)
        if size > 65536:
            yield "".join(batch)
            batch, size = [], 0
    if batch:
        yield "".join(batch)
    tail = {"displayTimeUnit": "ms", "otherData": other_data}
    yield "\n]," + _encode(tail)[1:] + "\n"
