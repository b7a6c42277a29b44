"""trace export of steps where one module is called many times (a loop, an inference job whose
steps never advance): each child belongs to the call it ran in, and the work stays O(n log n)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Tuple

from trace_events import check_hierarchy, check_tracks_nest, load_trace, spans

from probing.cli.pictures.timeline import Counted, ProcessTrack, Timeline, trace_document

BASE_US = 1_763_870_000_000_000
Row = Tuple[Any, ...]


def row(seq: int, module: str, stage: str, start_us: float, length_us: float, step: int = 0) -> Row:
    """A python.torch_trace row (TRACE_ROW order) of a call `start_us` into its step."""
    return (0, step, seq, module, "M", stage, length_us / 1e6, start_us / 1e6, None, None, None,
            BASE_US + round(start_us))  # fmt: skip


def export(rows: List[Row]) -> Dict[str, Any]:
    timeline = Timeline([ProcessTrack(0, 4242, "PID 4242")])
    counted = Counted(timeline.trace_events(rows))
    return load_trace("".join(trace_document(counted, {"producer": "test"})))


def drawn(document: Dict[str, Any], module: str, stage: str) -> List[Tuple[int, int]]:
    """(start into the step, duration) of every span of `module` in `stage`, in start order."""
    return sorted(
        (event["ts"] - BASE_US, event["dur"])
        for event in spans(document)
        if event["args"].get("module") == module and event["args"].get("stage") == stage
    )


def test_a_module_called_in_a_loop_stretches_only_the_call_its_child_ran_in() -> None:
    # model.block called 6 times, 30 us each, 15 us apart (less than the slack); the forward
    # child of each ends 10 us after its block (a hook's time); the backward child of each
    # begins 2 us before its block.
    rows = [row(0, "model", "forward", 0, 300)]
    for k in range(6):
        start = 5 + 45 * k
        rows.append(row(len(rows), "model.block", "forward", start, 30))
        rows.append(row(len(rows), "model.block.inner", "forward", start + 5, 35))
    for k in range(6):
        start = 400 + 35 * k
        rows.append(row(len(rows), "model.block", "backward", start, 30))
        rows.append(row(len(rows), "model.block.inner", "backward", start - 2, 20))
    rows.sort(key=lambda item: item[2])
    document = export(rows)
    check_tracks_nest(document)
    check_hierarchy(document)
    assert drawn(document, "model.block", "forward") == [(5 + 45 * k, 40) for k in range(6)]
    assert drawn(document, "model.block", "backward") == [(398 + 35 * k, 32) for k in range(6)]
    assert drawn(document, "model", "forward") == [(0, 300)]
    # one track each for forward and backward: no call was pushed off by a misdrawn one
    assert {event["tid"] for event in spans(document)} == {1, 2}


def loop_rows(iterations: int) -> List[Row]:
    """An inference job: every row in step 0, `model` called `iterations` times, each calling
    model.block 4 times in a loop, each block calling model.block.inner; exact nesting."""
    rows: List[Row] = []
    now = 0.0
    for _ in range(iterations):
        model_start = now
        now += 1.0
        for _ in range(4):
            block_start = now
            rows.append(row(0, "model.block.inner", "forward", now + 0.5, 2.0))
            now += 3.0
            rows.append(row(0, "model.block", "forward", block_start, now - block_start))
            now += 0.5
        rows.append(row(0, "model", "forward", model_start, now - model_start))
        now += 1.0
    return [(*item[:2], seq, *item[3:]) for seq, item in enumerate(rows)]


def test_fifty_thousand_rows_in_one_step_take_a_bounded_time_and_keep_exact_spans() -> None:
    rows = loop_rows(5600)  # 50,400 rows, 22,400 calls of model.block in step 0
    started = time.perf_counter()
    document = export(rows)
    elapsed = time.perf_counter() - started
    # The earlier matching scanned every same-named call per child: minutes here. Now ~1 s on a
    # loaded 2-core machine; the bound leaves room for the load, not for quadratic work.
    assert elapsed < 15.0, elapsed
    calls = [event for event in spans(document) if event["cat"] != "step"]
    assert len(calls) == len(rows)
    for event in calls:
        assert abs(event["dur"] - event["args"]["duration_s"] * 1e6) <= 1.0, event
    check_tracks_nest(document)
    check_hierarchy(document)
