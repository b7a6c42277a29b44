"""`trace export`'s events from python.torch_trace rows: the Chrome trace event format's rules,
nesting that survives rounding to microseconds, NaN instants, counters, hostile names."""

from __future__ import annotations

import json
import random
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import pytest
from trace_events import check_hierarchy, check_tracks_nest, load_trace, spans

from probing.cli.pictures.timeline import Counted, ProcessTrack, Timeline, trace_document

Row = Tuple[Any, ...]
WALL = 1_763_870_000.123456  # the agent's time.time() when its clock was read


class FakeClock:
    """Rows as the agent's StepClock stamps them: perf_counter starts and ends, `time_offset`
    from the step's start, `ts` the wall clock rounded to the microsecond (TIMESTAMP)."""

    def __init__(self, process: int = 0, perf_zero: float = 5123.456789123, late: float = 0.0) -> None:
        self.process = process
        self.late = late  # seconds this process's steps start after the others' (a straggler)
        self.perf_zero = perf_zero
        self.rows: List[Row] = []
        self.seq = 0

    def row(
        self,
        step: int,
        step_start: float,
        module: str,
        stage: str,
        start: float,
        end: float,
        allocated: Optional[float] = None,
        kind: str = "Linear",
    ) -> None:
        wall = WALL + self.late + (start - self.perf_zero)
        ts_us = round(wall * 1e6)
        self.rows.append(
            (
                self.process,
                step,
                self.seq,
                module,
                kind,
                stage,
                end - start,
                start - step_start,
                allocated,
                allocated,
                allocated,
                ts_us,
            )
        )
        self.seq += 1


# The submodules each module calls: model -> model.layers -> model.layers.0 and .1 -> .attn twice.
def children(name: str, depth: int) -> List[str]:
    return [[f"{name}.layers"], [f"{name}.0", f"{name}.1"], [f"{name}.attn"] * 2, []][depth]


def forward_call(
    calls: List[Tuple[str, float, float]], rng: random.Random, name: str, start: float, depth: int
) -> float:
    """A module called at `start` (with its children in turn): its end; each call in `calls`."""
    inner = start + rng.uniform(0, 2e-6)
    for child in children(name, depth):
        inner = forward_call(calls, rng, child, inner + rng.uniform(0, 1.5e-6), depth + 1)
    end = inner + rng.uniform(0.4e-6, 30e-6)
    calls.append((name, start, end))
    return end


def nested_steps(clock: FakeClock, steps: int, rng: random.Random, backward: bool = True) -> None:
    """A model > model.layers > model.layers.N > model.layers.N.attn forward, an optimizer, and
    backward in reverse; times with sub-microsecond fractions chosen to round both ways."""
    now = clock.perf_zero + 1.0
    for step in range(steps):
        clock.seq = 0
        step_start = now
        calls: List[Tuple[str, float, float]] = []
        end = forward_call(calls, rng, "model", now + rng.uniform(0, 1e-6), 0)
        for name, start, finish in sorted(calls, key=lambda item: item[1]):
            clock.row(step, step_start, name, "forward", start, finish)
        optimizer_start = end + rng.uniform(0, 5e-6)
        now = optimizer_start + rng.uniform(1e-6, 40e-6)
        if backward:
            for name, start, finish in sorted(calls, key=lambda item: item[1]):
                length = finish - start
                clock.row(
                    step, step_start, name, "backward", now + (end - finish), now + (end - finish) + length
                )
            now += (end - calls[-1][1]) + 1e-5
        clock.row(step, step_start, "optimizer", "optimizer", now, now + 7.3e-6, kind="AdamW")
        now += 1e-5 + rng.uniform(0, 1e-3)


def export(
    rows: Iterable[Row],
    processes: Sequence[ProcessTrack] = (ProcessTrack(0, 4242, "PID 4242"),),
    nans: Iterable[Row] = (),
    memory: Iterable[Row] = (),
) -> Tuple[dict, Timeline, int]:
    timeline = Timeline(processes)

    def events() -> Iterable[str]:
        yield from timeline.process_events()
        yield from timeline.trace_events(rows)
        yield from timeline.nan_events(nans)
        yield from timeline.memory_events(memory)

    counted = Counted(events())
    text = "".join(trace_document(counted, {"producer": "test"}))
    document = load_trace(text)
    assert len(document["traceEvents"]) == counted.count
    return document, timeline, counted.count


@pytest.mark.parametrize("seed", range(40))
def test_spans_nest_after_rounding_and_keep_their_durations(seed: int) -> None:
    clock = FakeClock(perf_zero=5123.456789123 + seed * 0.1234567)
    nested_steps(clock, 6, random.Random(seed))
    document, timeline, _ = export(clock.rows)
    check_tracks_nest(document)
    check_hierarchy(document)
    calls = [event for event in spans(document) if event["cat"] != "step"]
    assert len(calls) == len(clock.rows) and timeline.calls == len(clock.rows) and timeline.steps == 6
    for event in calls:
        assert abs(event["dur"] - event["args"]["duration_s"] * 1e6) <= 1.0, event
    # forward and optimizer on the training thread, backward on its own track; no overflow track
    assert {event["tid"] for event in calls if event["cat"] == "backward"} == {2}
    assert {event["tid"] for event in calls if event["cat"] != "backward"} == {1}


def test_a_step_spans_from_its_first_start_to_its_last_end() -> None:
    clock = FakeClock()
    nested_steps(clock, 3, random.Random(1))
    document, _, _ = export(clock.rows)
    for step in range(3):
        span = next(e for e in spans(document) if e["cat"] == "step" and e["args"]["step"] == step)
        mine = [e for e in spans(document) if e["cat"] != "step" and e["args"]["step"] == step]
        assert span["ts"] == min(e["ts"] for e in mine)
        assert span["ts"] + span["dur"] == max(e["ts"] + e["dur"] for e in mine)
        assert span["name"] == f"step {step}" and span["args"]["calls"] == len(mine)
        # wall clock: within a microsecond of the rows' own ts
        first = min((row for row in clock.rows if row[1] == step), key=lambda row: row[7])
        assert abs(span["ts"] - first[11]) <= 1


def test_partly_overlapping_calls_go_on_another_track_never_misdrawn() -> None:
    """CUDA durations are the device's while starts are the host's: a child may end after its
    parent. It moves to a second track of the thread, with its exact times."""
    clock = FakeClock()
    start = clock.perf_zero + 1
    clock.row(0, start, "model", "forward", start, start + 100e-6)
    clock.row(0, start, "model.0", "forward", start + 10e-6, start + 610e-6)  # 510 us past its parent
    clock.row(0, start, "model.1", "forward", start + 20e-6, start + 30e-6)
    document, _, _ = export(clock.rows)
    check_tracks_nest(document)
    tracks = {event["name"]: event["tid"] for event in spans(document)}
    assert tracks["model"] == tracks["step 0"] == 1 and tracks["model.0"] != 1
    names = {e["tid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    assert names[tracks["model.0"]] == "training thread 2"
    assert next(e for e in spans(document) if e["name"] == "model.0")["dur"] == 600
    assert next(e for e in spans(document) if e["name"] == "model")["dur"] == 100


def test_ranks_are_processes_on_one_clock() -> None:
    rows: List[Row] = []
    for rank in range(3):
        clock = FakeClock(
            process=rank, perf_zero=5000.0 - rank * 7.7, late=rank * 0.05
        )  # rank 2: 100 ms late
        nested_steps(clock, 2, random.Random(rank), backward=False)
        rows.extend(clock.rows)
    tracks = [ProcessTrack(rank, 9000 + rank, f"rank {rank} (PID {9000 + rank})") for rank in range(3)]
    document, _, _ = export(rows, tracks)
    check_tracks_nest(document)
    named = {e["pid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "process_name"}
    assert named == {9000: "rank 0 (PID 9000)", 9001: "rank 1 (PID 9001)", 9002: "rank 2 (PID 9002)"}
    first = {e["pid"]: e["ts"] for e in spans(document) if e["name"] == "step 0"}
    assert 99_000 <= first[9002] - first[9000] <= 101_000


def test_nan_events_are_instants_on_their_stage_track() -> None:
    clock = FakeClock()
    nested_steps(clock, 1, random.Random(3))
    base = clock.rows[0][11]
    nans = [
        (0, 0, 4, "model.layers.0", "Linear", "forward", "output float32[2]", 2, 0, True, base + 5),
        (0, 0, 9, "model.layers.1", "Linear", "backward", "grad_input[0]", 0, 1, False, base + 50),
    ]
    document, _, _ = export(clock.rows, nans=nans)
    instants = [e for e in document["traceEvents"] if e["ph"] == "i"]
    assert [(e["tid"], e["s"], e["ts"]) for e in instants] == [(1, "t", base + 5), (2, "t", base + 50)]
    assert instants[0]["name"] == "NaN/Inf in model.layers.0"
    assert instants[1]["args"] == {
        "module": "model.layers.1",
        "module_type": "Linear",
        "stage": "backward",
        "step": 0,
        "seq": 9,
        "tensor": "grad_input[0]",
        "nan_count": 0,
        "inf_count": 1,
        "input_finite": False,
    }


def test_counters_for_cuda_memory_when_known_and_rss() -> None:
    clock = FakeClock()
    start = clock.perf_zero + 1
    clock.row(0, start, "model", "forward", start, start + 1e-4, allocated=10.5)
    clock.row(0, start, "model.0", "forward", start + 1e-5, start + 2e-5, allocated=10.5)  # unchanged
    clock.row(0, start, "model.1", "forward", start + 3e-5, start + 4e-5, allocated=12.0)
    clock.row(0, start, "optimizer", "optimizer", start + 2e-4, start + 3e-4)  # NULL on CPU: none
    base = clock.rows[0][11]
    memory = [(0, base - 500_000, 812.25), (0, base + 500_000, 812.25), (0, base + 900_000, 900.0)]
    document, _, _ = export(clock.rows, memory=memory)
    counters = [e for e in document["traceEvents"] if e["ph"] == "C"]
    allocated = [(e["ts"], e["args"]["MB"]) for e in counters if e["name"] == "CUDA allocated (MB)"]
    assert [value for _, value in allocated] == [10.5, 12.0]  # one event per change
    assert {e["name"] for e in counters} == {"CUDA allocated (MB)", "CUDA reserved (MB)", "RSS (MB)"}
    rss = [(e["ts"], e["args"]["MB"]) for e in counters if e["name"] == "RSS (MB)"]
    assert rss == [(base - 500_000, 812.25), (base + 900_000, 900.0)]


def test_a_cpu_job_has_no_cuda_counters() -> None:
    clock = FakeClock()
    nested_steps(clock, 2, random.Random(5))
    document, _, _ = export(clock.rows)
    assert not [e for e in document["traceEvents"] if e["ph"] == "C"]


HOSTILE = [
    'model."quoted"',
    "model.new\nline",
    "model.</script><script>alert(1)</script>",
    "model.\u2028\x1b[2J",
    "model.back\\slash",
    "model.\udcff",
]


def test_hostile_module_names_stay_exact_strings() -> None:
    clock = FakeClock()
    start = clock.perf_zero + 1
    clock.row(0, start, "model", "forward", start, start + 1e-3, kind='<b>"Type"</b>\n')
    for index, name in enumerate(HOSTILE):
        clock.row(0, start, name, "forward", start + (index + 1) * 1e-4, start + (index + 1) * 1e-4 + 5e-5)
    nans = [(0, 0, 1, HOSTILE[2], "x", "forward", "</script>", 1, 0, True, clock.rows[1][11])]
    document, _, _ = export(clock.rows, nans=nans)
    names = [e["args"]["module"] for e in spans(document) if e["cat"] == "forward"]
    assert names == ["model", *HOSTILE]
    assert [e["name"] for e in spans(document) if e["cat"] == "forward"] == names
    assert spans(document)[1]["args"]["module_type"] == '<b>"Type"</b>\n'
    instant = next(e for e in document["traceEvents"] if e["ph"] == "i")
    assert instant["args"]["module"] == HOSTILE[2] and instant["args"]["tensor"] == "</script>"


def test_rows_without_a_finite_duration_are_counted_and_left_out() -> None:
    clock = FakeClock()
    start = clock.perf_zero + 1
    clock.row(0, start, "model", "forward", start, start + 1e-4)
    clock.rows.append(
        (
            0,
            0,
            1,
            "model.0",
            "Linear",
            "forward",
            float("nan"),
            1e-5,
            None,
            None,
            None,
            clock.rows[0][11] + 10,
        )
    )
    document, timeline, _ = export(clock.rows)
    assert timeline.skipped == 1 and [e["name"] for e in spans(document)] == ["step 0", "model"]


def test_a_row_stamped_against_another_step_start_uses_its_own_clock() -> None:
    """A backward pass that ends after the next step began has its time_offset measured from
    the new step's start; its wall clock still places it right."""
    clock = FakeClock()
    start = clock.perf_zero + 1
    clock.row(0, start, "model", "forward", start, start + 1e-4)
    clock.row(0, start, "optimizer", "optimizer", start + 2e-4, start + 3e-4)
    clock.row(0, start + 5e-3, "model", "backward", start + 1.5e-4, start + 1.8e-4)  # wrong step start
    document, _, _ = export(clock.rows)
    backward = next(e for e in spans(document) if e["cat"] == "backward")
    assert abs(backward["ts"] - clock.rows[2][11]) <= 1
    check_hierarchy(document)


def test_the_document_streams_in_parts_and_parses() -> None:
    events = (
        json.dumps({"ph": "C", "name": "n", "ts": i, "pid": 1, "tid": 1, "args": {"v": i}})
        for i in range(5000)
    )
    parts = list(trace_document(events, {"a": "b"}))
    assert len(parts) > 3  # not one string made at the end
    document = json.loads("".join(parts))
    assert len(document["traceEvents"]) == 5000 and document["otherData"] == {"a": "b"}
    assert json.loads("".join(trace_document(iter(()), {})))["traceEvents"] == []


def test_a_parent_backward_begun_a_hook_later_than_its_child_still_contains_it() -> None:
    """Both backward prehooks sit on one autograd node and the child's runs first: as measured,
    model.3 begins 1.3 us before model. Drawn, model spans it; the exact duration stays in args."""
    clock = FakeClock()
    start = clock.perf_zero + 1
    clock.row(0, start, "model", "forward", start, start + 1e-3)
    clock.row(0, start, "model.3", "backward", start + 2.0e-3, start + 2.12e-3)
    clock.row(0, start, "model", "backward", start + 2.0013e-3, start + 2.236e-3)
    document, _, _ = export(clock.rows)
    check_tracks_nest(document)
    check_hierarchy(document)
    backward = {e["name"]: e for e in spans(document) if e["cat"] == "backward"}
    assert backward["model"]["tid"] == backward["model.3"]["tid"] == 2
    assert backward["model"]["ts"] == backward["model.3"]["ts"]
    assert backward["model"]["args"]["duration_s"] == pytest.approx(234.7e-6)


def test_a_parent_backward_begun_after_a_nan_check_in_its_childs_hook_still_contains_it() -> None:
    """With `nan on`, the child's prehook checks the gradient first: the parent's backward is
    stamped 116 us after its child's, well past the slack; it still spans the child."""
    clock = FakeClock()
    start = clock.perf_zero + 1
    clock.row(0, start, "model", "forward", start, start + 1e-3)
    clock.row(0, start, "model.3", "backward", start + 2.0e-3, start + 2.246e-3)
    clock.row(0, start, "model", "backward", start + 2.116e-3, start + 2.453e-3)
    clock.row(0, start, "model.2", "backward", start + 2.265e-3, start + 2.332e-3)
    document, _, _ = export(clock.rows)
    check_tracks_nest(document)
    check_hierarchy(document)
    assert {e["tid"] for e in spans(document) if e["cat"] == "backward"} == {2}
