"""analysis/stragglers.py on arrivals made here: who is late, by how much, in which phase; a
stuck job told from a slow one; steps found by the period of the collectives."""

from __future__ import annotations

import random
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from probing.analysis.stragglers import (
    BACKWARD,
    DATA,
    FORWARD,
    OWN_CODE,
    Arrival,
    RankWatched,
    Stack,
    find_period,
    judge,
    own_frame,
    phase_of,
)
from probing.cli.render.stragglers import verdict_json, verdict_line

START = 1_800_000_000.0
STEP_S = 0.06
STEPS = 120
LOADER = "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725)"
MODULE = "Module._call_impl (torch/nn/modules/module.py:1789)"
BACKWARD_FRAME = "Tensor.backward (torch/_tensor.py:623)"
LOOP = "<module> (train.py:30)"


def _arrivals(rank: int, delays: Dict[int, float], seed: int) -> List[Arrival]:
    noise = random.Random(seed * 100 + rank)
    late = delays.get(rank, 0.0)
    return [
        Arrival(
            "0", seq, "all_reduce", "[[2632]]", START + seq * STEP_S + late + noise.uniform(0, 0.002), False
        )
        for seq in range(STEPS)
    ]


def _stacks(extra: Optional[Tuple[str, str]] = None, weight: float = 0.0) -> List[Stack]:
    stacks: List[Stack] = [
        (("MainThread", LOOP, LOADER, "Shards.__getitem__ (train.py:16)"), 5.0),
        (("MainThread", LOOP, MODULE, "Net.forward (train.py:26)"), 20.0),
        (("MainThread", LOOP, BACKWARD_FRAME), 40.0),
        (("MainThread", LOOP), 10.0),
        (("pt_autograd_0", "worker (threading.py:1)"), 50.0),  # not the thread that issues them
    ]
    if extra is not None:
        stacks.append((("MainThread", LOOP, *extra), weight))
    return stacks


def _job(
    delays: Dict[int, float], stacks: Optional[Dict[int, Sequence[Stack]]] = None, seed: int = 1
) -> List[RankWatched]:
    chosen = stacks or {}
    return [
        RankWatched(rank, 0, _arrivals(rank, delays, seed), list(chosen.get(rank, _stacks())))
        for rank in range(4)
    ]


WINDOW = (START - 0.1, START + STEPS * STEP_S + 1.0)


def test_a_rank_late_by_20_ms_is_named_with_its_phase_and_frame() -> None:
    stacks = {1: _stacks((LOADER, "ShardReader.read (shards.py:88)"), 25.0)}
    verdict = judge(_job({1: 0.020}, stacks), WINDOW)
    [straggler] = verdict.stragglers
    assert straggler.rank == 1 and abs(straggler.delay_s - 0.020) < 0.003
    assert straggler.late_share > 0.95 and straggler.phase == DATA
    assert straggler.frame == "ShardReader.read (shards.py:88)"
    assert abs(straggler.job_share - 0.020 / STEP_S) < 0.06
    assert verdict.compared == STEPS and verdict.period == 1
    assert verdict.step_s is not None and abs(verdict.step_s - STEP_S) < 0.002
    timing = {each.rank: each for each in verdict.ranks}
    assert timing[1].last_share > 0.95 and timing[0].last_share < 0.05
    assert (timing[0].waiting_s or 0) > 0.015 > (timing[1].waiting_s or 0)
    assert timing[1].samples == 100  # the main thread's samples only
    line = verdict_line(verdict)
    assert line.startswith("rank 1 is late to ")
    assert "in data loading (`ShardReader.read`, shards.py:88)" in line


def test_equal_ranks_have_no_straggler_whatever_the_noise() -> None:
    for seed in range(20):
        verdict = judge(_job({}, seed=seed), WINDOW)
        assert verdict.stragglers == [] and verdict.stuck is None, verdict.ranks
    line = verdict_line(verdict)
    assert line.startswith("no straggler: no rank is late to 75% of the all_reduces by 3.0 ms or more; ")
    nearest = max(verdict.ranks, key=lambda timing: timing.delay_s)
    assert f"rank {nearest.rank}, is late to {nearest.late_share:.0%} of them by " in line, line
    assert verdict_json(verdict)["verdict"] == "no straggler"


def test_two_stragglers_are_named_in_order_of_their_delay() -> None:
    stacks = {
        1: _stacks((LOADER, "ShardReader.read (shards.py:88)"), 20.0),
        2: _stacks((MODULE, "Net.forward (train.py:27)"), 40.0),
    }
    verdict = judge(_job({1: 0.015, 2: 0.035}, stacks), WINDOW)
    assert [(each.rank, each.phase) for each in verdict.stragglers] == [(2, FORWARD), (1, DATA)]
    assert verdict_json(verdict)["verdict"] == "stragglers"


def test_a_rank_waiting_in_a_collective_another_never_reached_is_stuck_not_slow() -> None:
    watched = _job({})
    at = START + (STEPS + 1) * STEP_S
    waiting = Arrival("0", STEPS, "all_reduce", "[[2632]]", at, True)
    stuck_stacks: List[Stack] = [(("MainThread", LOOP, "ShardReader.read (shards.py:88)"), 9.0)]
    views = [
        view._replace(arrivals=[], stacks=stuck_stacks)
        if view.rank == 2
        else view._replace(arrivals=[waiting])
        for view in watched
    ]
    verdict = judge(views, (at + 0.5, at + 3.0))
    assert verdict.stuck is not None and verdict.stuck.behind == [2] and verdict.stuck.waiting == [0, 1, 3]
    assert verdict.stragglers == []
    line = verdict_line(verdict)
    assert line.startswith("the job is stuck, not slow: ranks 0, 1, 3 waited 3.0 s in all_reduce")
    assert "rank 2 never arrived (rank 2 in `ShardReader.read`, shards.py:88)" in line
    assert "`hang --ranks all`" in line


def test_a_rank_that_gave_nothing_is_missing_and_decides_nothing() -> None:
    views = _job({1: 0.02})
    views[3] = RankWatched(3, 0, None, None, missing_reason="its agent did not answer")
    verdict = judge(views, WINDOW)
    assert verdict.missing == [(3, "its agent did not answer")]
    assert [each.rank for each in verdict.stragglers] == [1]


def test_too_few_collectives_give_no_verdict() -> None:
    views = [view._replace(arrivals=(view.arrivals or [])[:3]) for view in _job({1: 0.02})]
    verdict = judge(views, WINDOW)
    assert verdict.stragglers == [] and verdict.step_s is None
    assert verdict_line(verdict).startswith("too few collectives to compare")


def test_the_period_is_the_repeating_pattern_of_ops_and_sizes() -> None:
    def call(op: str, sizes: str) -> Arrival:
        return Arrival("0", 0, op, sizes, 0.0, False)

    step = [call("all_reduce", "[[10]]"), call("all_reduce", "[[20]]"), call("broadcast", "[[1]]")]
    assert find_period(step * 10) == 3
    assert find_period([call("all_reduce", "[[10]]")] * 10) == 1


def test_phases_come_from_the_outermost_marker_frame() -> None:
    assert phase_of([LOOP, LOADER, MODULE]) == DATA
    assert phase_of([LOOP, BACKWARD_FRAME, MODULE]) == BACKWARD
    assert phase_of([LOOP, "step (t.py:9)"]) == OWN_CODE
    # A job's own function named as torch's is not torch's.
    assert phase_of([LOOP, "Module._call_impl (mymodule.py:3)"]) == OWN_CODE
    assert own_frame([LOOP, "read (shards.py:8)", "get (queue.py:180)", MODULE]) == "read (shards.py:8)"


def test_rows_a_job_wrote_badly_are_no_arrivals() -> None:
    from probing.engine.jobs.stragglers import arrivals_of

    good = {
        "pg_id": "0",
        "seq": 3,
        "op": "all_reduce",
        "input_sizes": "[[4]]",
        "time_created": 1.5,
        "state": "completed",
    }
    rows = [
        good,
        dict(good, time_created=float("nan")),
        dict(good, time_created=float("inf")),
        dict(good, time_created="1.5"),
        dict(good, seq=None),
        dict(good, is_p2p=True),
        dict(good, state="scheduled", seq=4),
    ]
    assert arrivals_of(rows) == [
        Arrival("0", 3, "all_reduce", "[[4]]", 1.5, False),
        Arrival("0", 4, "all_reduce", "[[4]]", 1.5, True),
    ]


def test_one_straggler_among_1024_ranks_is_named_in_seconds() -> None:
    import time

    views = [
        RankWatched(rank, rank // 64, _arrivals(rank, {517: 0.02}, seed=rank), [(("MainThread", LOOP), 10.0)])
        for rank in range(1024)
    ]
    started = time.perf_counter()
    verdict = judge(views, WINDOW)
    took = time.perf_counter() - started
    assert [each.rank for each in verdict.stragglers] == [517]
    assert took < 10, took  # 1.2 s on a loaded 2-core machine


def test_a_job_that_got_stuck_inside_the_window_is_stuck_not_slow() -> None:
    watched = _job({})
    at = START + STEPS * STEP_S  # every rank stepped until here; then rank 2 never came
    waiting = Arrival("0", STEPS, "all_reduce", "[[2632]]", at, True)
    views = [
        view if view.rank == 2 else view._replace(arrivals=[*(view.arrivals or []), waiting])
        for view in watched
    ]
    late = judge(views, (START - 0.1, at + 2.0))  # waited 2 s, 33 steps of 60 ms: stuck
    assert late.stuck is not None and late.stuck.behind == [2] and late.stragglers == []
    assert late.compared == STEPS and late.step_s is not None
    soon = judge(views, (START - 0.1, at + 0.2))  # 0.2 s: a slow rank's peers wait that long
    assert soon.stuck is None


def test_a_slow_step_is_not_taken_for_stuck() -> None:
    def arrivals(rank: int) -> List[Arrival]:
        late = 0.9 if rank == 1 else 0.0
        return [
            Arrival("0", seq, "all_reduce", "[[4]]", START + seq * 2.0 + late, False) for seq in range(10)
        ]

    slow = [RankWatched(rank, 0, arrivals(rank), None) for rank in range(4)]
    # Rank 0's next collective has waited 1.5 s for rank 1, which is late by 0.9 s every 2 s step.
    waiting = Arrival("0", 10, "all_reduce", "[[4]]", START + 20.0, True)
    slow[0] = slow[0]._replace(arrivals=[*arrivals(0), waiting])
    verdict = judge(slow, (START - 0.1, START + 21.5))
    assert verdict.stuck is None and [each.rank for each in verdict.stragglers] == [1]


def test_a_rank_whose_sampling_failed_has_its_collectives_read_at_the_windows_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read at once, a collective it was in would look waited in for the rest of the window: a CI
    run called a job stuck when a rank's sampling failed 2 s into a 4 s window."""
    from contextlib import contextmanager

    from probing.engine.jobs import stragglers as engine
    from probing.errors import ProbingError

    read_at: List[float] = []

    def failing(*_: object) -> None:
        raise ProbingError("the agent failed: AttributeError")

    def table(_client: object, table: str, _timeout: float) -> List[Dict[str, object]]:
        read_at.append(time.monotonic())
        return []

    class Remote:
        remote = True

        @contextmanager
        def connect(self, _timeout: float) -> Iterator[object]:
            yield object()

    monkeypatch.setattr(engine, "sample_on", failing)
    monkeypatch.setattr(engine, "_table_rows", table)
    began = time.monotonic()
    watched = engine.watch_rank(Remote(), 0.5, 5.0)  # type: ignore[arg-type]
    assert read_at[-1] - began >= 0.5 and any("could not be sampled" in note for note in watched.notes)
