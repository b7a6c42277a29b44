"""The pieces that keep a command from holding the job's GIL long: the pacer of Python loops, the
estimate-first listing of gc's objects, and the Flight Recorder's decode in slices."""

from __future__ import annotations

import gc
import pickle
import threading
import time
from typing import List

import pytest

from probing.agent import pacing
from probing.agent.memory import objects
from probing.agent.pytorch import flight_recorder


def test_the_pacer_pauses_once_a_slice_is_used_up() -> None:
    pacer = pacing.Pacer()
    assert not pacer.pause_if_due()
    deadline = time.perf_counter() + pacing.SLICE_S * 1.5
    while time.perf_counter() < deadline:
        pass
    assert pacer.pause_if_due() and pacer.pauses == 1
    assert not pacer.pause_if_due()


def test_a_larger_scan_budget_allows_a_longer_stall_never_a_shorter_one() -> None:
    assert pacing.stall_bound(1.0) == pacing.MAX_STALL_S
    assert pacing.stall_bound(0.0001) == pacing.MAX_STALL_S
    assert pacing.stall_bound(20.0) == pytest.approx(0.2)


def test_a_generation_too_costly_to_list_is_left_out_and_said() -> None:
    objects.forget()
    listed, skipped = objects.list_generation(2, bound_s=1e-12)
    assert listed is None and skipped is not None
    assert skipped.generation == 2 and skipped.objects > 0 and skipped.stall_s > 1e-12
    assert (
        "gc's generation 2 (about" in skipped.describe()
        and "--scan-budget S allows S/100" in skipped.describe()
    )


def test_a_listing_teaches_the_size_and_cost_of_its_generation() -> None:
    objects.forget()
    kept: List[List[int]] = [[] for _ in range(50_000)]  # noqa: F841 - held: the oldest generation grows
    gc.collect()
    listed, skipped = objects.list_generation(2, bound_s=10.0)
    assert listed is not None and skipped is None
    size = len(listed)
    assert size >= 50_000
    # Known now: the estimate is what was listed, scaled by the allocated blocks since (unchanged).
    assert objects.estimated_size(2) == pytest.approx(size, rel=0.05)
    assert objects._cost_s[2] != objects.FIRST_COST_S
    objects.release(listed, pacing.Pacer())
    assert listed == []


def test_counting_says_which_generations_it_left_out() -> None:
    total, skipped, _ = objects.count_objects(bound_s=10.0, pacer=pacing.Pacer())
    assert total is not None and total > 1000 and skipped == []
    total, skipped, _ = objects.count_objects(bound_s=1e-12, pacer=pacing.Pacer())
    assert total is None and [why.generation for why in skipped] == [0, 1, 2]


def _dump(entries: int) -> bytes:
    dump = {
        "version": "2.10",
        "pg_status": {"0": {"last_enqueued_collective": entries}},
        "entries": [
            {"record_id": index, "collective_seq_id": index + 1, "input_sizes": [[16]], "state": "scheduled",
             "process_group": ("0", "default_pg"), "retired": True, "time_discovered_started_ns": None}
            for index in range(entries)
        ],
    }  # fmt: skip
    return pickle.dumps(dump, protocol=2)


def test_a_large_flight_recorder_dump_is_decoded_in_slices_to_the_same_dict() -> None:
    raw = _dump(8000)
    assert len(raw) > flight_recorder.DECODE_AT_ONCE_BYTES
    assert flight_recorder.decode(raw) == pickle.loads(raw)
    small = _dump(10)
    assert flight_recorder.decode(small) == pickle.loads(small)


@pytest.mark.parametrize("entries", [10, 8000])
def test_a_flight_recorder_dump_that_names_a_class_is_refused(entries: int) -> None:
    padded = [
        {"record_id": index, "profiling_name": f"gloo:all_reduce {index:040d}"} for index in range(entries)
    ]
    raw = pickle.dumps({"entries": padded, "evil": pickle.Pickler}, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="names"):
        flight_recorder.decode(raw)


def test_reading_the_frames_leaves_gc_as_the_job_set_it() -> None:
    from probing.agent.stacks import current_frames

    assert gc.isenabled()
    assert threading.get_ident() in current_frames() and gc.isenabled()
    gc.disable()
    try:
        assert threading.get_ident() in current_frames() and not gc.isenabled()
    finally:
        gc.enable()
