"""The report's summaries of a job's tables, in DuckDB over crafted rows: step times without the
step under way, per-step module means with forward and backward apart, memory bucketed to a
bounded number of points that keep their peaks."""

from __future__ import annotations

from probing.engine.query import static_session
from probing.engine.report_tables import (
    MEMORY_POINTS,
    memory_history,
    nan_events,
    slowest_modules,
    step_times,
)
from probing.schema.tables import NAN_EVENTS, PROCESS_MEMORY, TORCH_TRACE
from probing.sql.session import SqlSession

START = 1.7e9


def traced(steps: int, every: int = 1) -> SqlSession:
    """Each step starts 1 s after the one before (most of it outside traced calls: data loading):
    model.2 forward 20 ms at 0, its backward 5 ms at 30 ms, the optimizer 2 ms at 40 ms. Every
    `every`th step is traced."""
    rows = []
    for step in range(0, steps, every):
        base = START + step
        for seq, (module, kind, stage, duration, offset) in enumerate([
            ("model.2", "Middle", "forward", 0.020, 0.0),
            ("model.2", "Middle", "backward", 0.005, 0.030),
            ("optimizer", "AdamW", "optimizer", 0.002, 0.040),
        ]):  # fmt: skip
            rows.append(
                (step, seq, module, kind, stage, duration, offset, None, None, None, 0, base + offset)
            )
    session = static_session()
    session.load_rows(TORCH_TRACE, rows)
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
    rows = [(0, n, f"m{n}", "Linear", "forward", n / 1e6, 0.0, None, None, None, 0, START)
            for n in range(500)]  # fmt: skip
    rows += [(1, 0, "m0", "Linear", "forward", 0.0, 0.0, None, None, None, 0, START + 1)]
    session = static_session()
    session.load_rows(TORCH_TRACE, rows)
    modules = slowest_modules(session)
    assert [module["module"] for module in modules] == [f"m{n}" for n in range(499, 484, -1)]


def test_tables_that_are_empty_give_nothing() -> None:
    session = static_session()
    assert step_times(session) == [] and slowest_modules(session) == [] and memory_history(session) == []
    assert nan_events(session) == ([], [], 0)


def test_nan_events_give_the_first_few_every_step_and_the_count() -> None:
    rows = [(step, 1, "model.2", "Middle", "forward", "output[0]", 1, 0, True, 0, START + step)
            for step in range(40, 100)]  # fmt: skip
    session = static_session()
    session.load_rows(NAN_EVENTS, rows)
    shown, steps, total = nan_events(session)
    assert len(shown) == 20 and shown[0]["step"] == 40
    assert steps == list(range(40, 100)) and total == 60
