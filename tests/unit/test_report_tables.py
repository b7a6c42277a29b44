"""The report's summaries of a job's tables, in DuckDB over crafted rows: step times without the
step under way, per-step module means with forward and backward apart, memory bucketed to a
bounded number of points that keep their peaks."""

from __future__ import annotations

from typing import Any, List, Tuple

from probing.engine.flames.modules import torch_flame
from probing.engine.query import static_session
from probing.engine.report.tables import (
    MEMORY_POINTS,
    memory_history,
    nan_events,
    slowest_modules,
    step_times,
)
from probing.schema.definition import Table
from probing.schema.tables import NAN_EVENTS, PROCESS_MEMORY, TORCH_TRACE
from probing.sql.session import SqlSession

START = 1.7e9


CALLS = [
    ("model.2", "Middle", "forward", 0.020, 0.0),
    ("model.2", "Middle", "backward", 0.005, 0.030),
    ("optimizer", "AdamW", "optimizer", 0.002, 0.040),
]


def step_rows(step: int, base: float, session: int = 1, rank: int = 0) -> List[Tuple[Any, ...]]:
    """One step's rows: model.2 forward 20 ms at 0, its backward 5 ms at 30 ms, the optimizer
    2 ms at 40 ms, the step starting at `base`."""
    return [
        (step, seq, module, kind, stage, duration, offset, None, None, None, rank, base + offset, session)
        for seq, (module, kind, stage, duration, offset) in enumerate(CALLS)
    ]


def traced(steps: int, every: int = 1) -> SqlSession:
    """Each step starts 1 s after the one before (most of it outside traced calls: data loading).
    Every `every`th step is traced."""
    rows = [row for step in range(0, steps, every) for row in step_rows(step, START + step)]
    session = static_session()
    session.load_rows(TORCH_TRACE, rows)
    return session


def off_and_on_rows(gap: float = 9.66, rank: int = 0, start: float = START) -> List[Tuple[Any, ...]]:
    """`trace on` in the middle of step 0 (its rows session -1), steps 1-9 traced, `trace off` in
    step 10, untraced for `gap` seconds (no hooks: the step counter stands still), `trace on` in
    the middle of that same step 10 (its rows session -2), steps 11-20 whole, 21 under way. The
    steps of 1 s, but the one across the gap; step 0 and step 10 started 0.3 s before tracing."""
    rows = step_rows(0, start - 0.3, -1, rank)
    rows += [row for step in range(1, 11) for row in step_rows(step, start + step, 1, rank)]
    restarted = start + 10 + gap
    rows += [row for row in step_rows(10, restarted - 0.3, -2, rank) if row[6] > 0.0]  # only after trace on
    rows += [row for step in range(11, 22) for row in step_rows(step, restarted + step - 10, 2, rank)]
    return rows


def traced_off_and_on() -> SqlSession:
    session = static_session()
    session.load_rows(TORCH_TRACE, off_and_on_rows())
    return session


def test_step_times_leave_the_step_under_way_out() -> None:
    steps = step_times(traced(5))
    assert [step["step"] for step in steps] == [0, 1, 2, 3]
    assert all(abs(step["traced_s"] - 0.042) < 1e-9 for step in steps)


def test_a_step_lasts_from_its_start_to_the_next_one_s_the_gap_between_steps_included() -> None:
    steps = step_times(traced(5))
    assert all(abs(step["seconds"] - 1.0) < 1e-6 for step in steps)  # not the 42 ms in traced calls


def test_with_untraced_steps_between_the_time_is_per_step() -> None:
    steps = step_times(traced(13, every=4))  # steps 0, 4, 8 and 12 (under way)
    assert [step["step"] for step in steps] == [0, 4, 8]
    assert all(abs(step["seconds"] - 1.0) < 1e-6 for step in steps)


def test_a_single_step_is_shown_though_it_may_be_under_way() -> None:
    assert [step["step"] for step in step_times(traced(1))] == [0]


def test_steps_are_only_steps_while_tracing_was_on() -> None:
    """Issue 26: after `trace off` and `trace on`, the untraced gap was one step ("slowest
    9.66 s"). A step is paced within its tracing session; the steps each session began or ended
    in the middle of (0, and 10 on both sides of the gap) are no steps."""
    steps = step_times(traced_off_and_on())
    assert [step["step"] for step in steps] == [*range(1, 10), *range(11, 21)]
    assert max(step["seconds"] for step in steps) < 1.0 + 1e-6
    assert min(step["seconds"] for step in steps) > 1.0 - 1e-6
    modules = slowest_modules(traced_off_and_on())
    # The window: the last 20 step numbers up to the newest whole step (20), whole steps only.
    assert modules[0]["steps"] == 19 and modules[0]["calls"] == 19  # steps 1-9 and 11-20


def test_each_rank_s_steps_are_paced_within_its_own_sessions() -> None:
    ranked = static_session()
    ranked.load_rows(TORCH_TRACE, off_and_on_rows() + off_and_on_rows(3.0, rank=1, start=START + 0.5))
    steps = step_times(ranked, "rank")
    for rank in (0, 1):
        mine = [step for step in steps if step["rank"] == rank]
        assert [step["step"] for step in mine] == [*range(1, 10), *range(11, 21)]
        assert all(abs(step["seconds"] - 1.0) < 1e-6 for step in mine)


def test_the_module_flame_graph_is_of_the_newest_session_s_whole_steps() -> None:
    """Its mean per step was over both sessions ("mean of 1 074 steps (steps 1-1105)")."""
    flame = torch_flame(traced_off_and_on(), None, "PID 1", [])
    assert flame.figures["range"] == "steps 11-20" and flame.figures["steps"] == 10
    assert any("tracing session 2 only" in note and "(1-10)" in note for note in flame.notes), flame.notes
    forward = dict(flame.stacks)[("forward", "model.2 (Middle)")]
    assert abs(forward - 0.020) < 1e-9  # one call a step, of 20 ms
    chosen = torch_flame(traced_off_and_on(), "5:12", "PID 1", [])  # --steps: the parts of steps left out
    assert chosen.figures["steps"] == 7  # 5-9, 11 and 12: trace off cut 10, and trace on began in it


def test_a_table_older_than_tracing_sessions_is_one_session() -> None:
    columns = [column for column in TORCH_TRACE.columns if column.name != "session"]
    older = Table(TORCH_TRACE.name, TORCH_TRACE.doc, columns)
    session = SqlSession([older.describe()])
    session.load_rows(older, [row[:-1] for step in range(5) for row in step_rows(step, START + step)])
    assert [step["step"] for step in step_times(session)] == [0, 1, 2, 3]
    assert torch_flame(session, None, "PID 1", []).figures["range"] == "steps 1-3"


def test_slowest_modules_are_per_step_means_with_the_stages_apart() -> None:
    modules = slowest_modules(traced(30))
    assert [module["module"] for module in modules] == ["model.2", "optimizer"]
    middle = modules[0]
    assert abs(middle["forward_s"] - 0.020) < 1e-9 and abs(middle["backward_s"] - 0.005) < 1e-9
    # The last 20 whole steps; one forward and one backward call a step is 20 calls, not 40.
    assert middle["steps"] == 20 and middle["calls"] == 20


def test_memory_history_is_bounded_and_keeps_the_peak() -> None:
    samples = 5000
    rows = [(START + i, 100.0 + (500.0 if i == 1234 else 0.0), 200.0, 1.0, 3, 10, None, None, None)
            for i in range(samples)]  # fmt: skip
    session = static_session()
    session.load_rows(PROCESS_MEMORY, rows)
    history = memory_history(session)
    assert len(history) <= MEMORY_POINTS
    assert max(point["rss_mb"] for point in history) == 600.0
    assert history[0]["ts"] == START and [p["ts"] for p in history] == sorted(p["ts"] for p in history)


def test_slowest_modules_are_ranked_and_cut_in_sql() -> None:
    rows = [(0, n, f"m{n}", "Linear", "forward", n / 1e6, 0.0, None, None, None, 0, START, 1)
            for n in range(500)]  # fmt: skip
    rows += [(1, 0, "m0", "Linear", "forward", 0.0, 0.0, None, None, None, 0, START + 1, 1)]
    session = static_session()
    session.load_rows(TORCH_TRACE, rows)
    modules = slowest_modules(session)
    assert [module["module"] for module in modules] == [f"m{n}" for n in range(499, 484, -1)]


def test_tables_that_are_empty_give_nothing() -> None:
    session = static_session()
    assert step_times(session) == [] and slowest_modules(session) == [] and memory_history(session) == []
    assert nan_events(session) == ([], [], 0)


def test_nan_events_give_the_first_few_every_step_and_the_count() -> None:
    rows = [(step, 1, "model.2", "Middle", "forward", "output[0]", 1, 0, True, False, True, 0, START + step)
            for step in range(40, 100)]  # fmt: skip
    session = static_session()
    session.load_rows(NAN_EVENTS, rows)
    shown, steps, total = nan_events(session)
    assert len(shown) == 20 and shown[0]["step"] == 40
    assert steps == list(range(40, 100)) and total == 60
    assert shown[0]["weights_finite"] is False and shown[0]["weights_already_nonfinite"] is True
