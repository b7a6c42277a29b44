"""The module flame graph: hierarchy from qualified names, self times never negative, steps."""

from __future__ import annotations

from typing import Any

import pytest

from probing.agent.stack_sampler import next_interval
from probing.engine.flames.modules import default_steps, module_stacks, parse_steps
from probing.errors import UsageError


def test_modules_nest_by_qualified_name_with_self_times() -> None:
    rows = [
        ("forward", "model", "Net", 1.0, 2, 2),  # 0.5 s per step
        ("forward", "model.layers", "ModuleList", 0.8, 2, 2),
        ("forward", "model.layers.0", "Block", 0.6, 2, 2),
        ("forward", "model.layers.1", "Block", 0.1, 2, 2),
        ("backward", "model", "Net", 0.4, 2, 2),
        ("backward", "model.head", "Linear", 0.6, 2, 2),  # more than its parent: clamped
        ("optimizer", "optimizer", "AdamW", 0.2, 2, 2),
    ]
    stacks, clamped = module_stacks(rows)
    by_path = {names: weight for names, weight in stacks}
    assert by_path[("forward", "model (Net)")] == pytest.approx(0.1)
    assert by_path[("forward", "model (Net)", "model.layers (ModuleList)")] == pytest.approx(0.05)
    assert by_path[("forward", "model (Net)", "model.layers (ModuleList)", "model.layers.0 (Block)")] == (
        pytest.approx(0.3)
    )
    assert by_path[("backward", "model (Net)")] == 0.0 and clamped == 1
    assert by_path[("optimizer", "optimizer")] == pytest.approx(0.1)
    assert [names[0] for names, _ in stacks][0] == "forward"
    assert all(weight >= 0 for _, weight in stacks)


def test_children_over_their_module_by_the_hooks_noise_are_clamped_without_a_note() -> None:
    rows = [
        ("backward", "model", "Net", 0.400, 2, 2),
        ("backward", "model.head", "Linear", 0.404, 2, 2),  # 1 % over: noise
        ("forward", "model", "Net", 0.0010, 1, 1),
        ("forward", "model.head", "Linear", 0.00105, 1, 1),  # 5 % over, but 50 µs: noise
    ]
    stacks, clamped = module_stacks(rows)
    assert clamped == 0
    assert {names: weight for names, weight in stacks}[("backward", "model (Net)")] == 0.0


def test_an_untraced_parent_is_skipped_to_the_nearest_traced_one() -> None:
    stacks, _ = module_stacks(
        [("forward", "model.a.b", "X", 1.0, 1, 1), ("forward", "model", "M", 2.0, 1, 1)]
    )
    assert ("forward", "model (M)", "model.a.b (X)") in {names for names, _ in stacks}


def test_steps_parse_and_default_to_whole_steps() -> None:
    assert parse_steps("3:7") == (3, 7) and parse_steps(":7") == (None, 7) and parse_steps("5") == (5, 5)
    assert parse_steps("4:") == (4, None) and parse_steps(None) is None
    with pytest.raises(UsageError):
        parse_steps("7:3")
    with pytest.raises(UsageError):
        parse_steps("a:b")
    assert default_steps(0, 9, 10) == (1, 8) and default_steps(4, 5, 2) == (4, 4)


def test_the_sampling_interval_stretches_to_keep_the_cost_under_half_a_percent() -> None:
    assert next_interval(100.0, 0.00001) == pytest.approx(0.01)  # cheap: the requested rate
    assert next_interval(100.0, 0.0001) == pytest.approx(0.025)  # 100 us a sample: 40 Hz


@pytest.mark.parametrize("text", ["", " ", "-3:-1", "1_0:20", "\u0663:\u0665", "\u00b2", "1:2:3", "9:2"])
def test_trace_export_and_flamegraph_torch_refuse_the_same_steps(text: str) -> None:
    from probing.engine.timeline import parse_steps as export_steps

    with pytest.raises(ValueError):
        export_steps(text)
    with pytest.raises(UsageError):
        parse_steps(text)


@pytest.mark.parametrize(
    "text, chosen",
    [("3:7", (3, 7)), (" 3 : 7 ", (3, 7)), ("5", (5, 5)), (":7", (None, 7)), (":", (None, None))],
)
def test_trace_export_and_flamegraph_torch_read_steps_alike(text: str, chosen: Any) -> None:
    from probing.engine.timeline import parse_steps as export_steps

    assert tuple(export_steps(text)) == chosen and parse_steps(text) == chosen


def test_the_samples_intervals_are_jittered_around_their_mean() -> None:
    from probing.agent.stack_sampler import Jitter

    jitter = Jitter(12345)
    factors = [jitter.next() for _ in range(10000)]
    assert all(0.5 <= factor < 1.5 for factor in factors)
    assert abs(sum(factors) / len(factors) - 1.0) < 0.02  # the rate asked for, on average
    assert len({round(factor, 3) for factor in factors}) > 900  # not a few fixed values
