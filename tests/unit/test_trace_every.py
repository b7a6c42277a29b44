"""How far apart the tracer's traced steps are without --every (agent/pytorch/clock.py): a traced
step's cost is its time over the untraced steps', at least the time inside its hooks."""

from __future__ import annotations

import math
import threading

import pytest

from probing.agent.pytorch import clock as clock_module
from probing.agent.pytorch.clock import DEFAULT_BUDGET, HOOKS_SEEN_INVERSE, StepClock

torch = pytest.importorskip("torch")


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tracing(monkeypatch: pytest.MonkeyPatch) -> tuple[StepClock, FakeTime]:
    fake = FakeTime()
    monkeypatch.setattr(clock_module, "perf_counter", fake)
    clock = StepClock(torch, threading.RLock())
    clock.trace_on = True
    clock.step_start = fake.now
    clock.refresh()
    return clock, fake


def step(clock: StepClock, fake: FakeTime, untraced_s: float, traced_s: float, hooks_s: float) -> bool:
    """One step of the job: `traced_s` long with `hooks_s` inside the hooks if it is traced."""
    traced = clock.tracing_now
    if traced:
        clock.step_calls, clock.step_cost = 60, hooks_s
    fake.now += traced_s if traced else untraced_s
    clock.advance()
    return traced


def test_a_traced_step_costs_its_time_over_the_untraced_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """An H200-like job: untraced steps of 10 ms, traced ones of 15 ms of which the hooks saw
    2 ms; attaching and detaching the hooks 0.5 ms each."""
    clock, fake = tracing(monkeypatch)
    clock.switch_cost = [0.0005, 0.0005]
    assert step(clock, fake, 0.010, 0.015, 0.002)
    # No untraced step known yet: the hooks' own 3 ms, counted four times.
    first = HOOKS_SEEN_INVERSE * 0.003 / (0.015 - 0.003)
    assert clock.every == min(100, math.ceil(first / DEFAULT_BUDGET))
    every = clock.every
    traced = [step(clock, fake, 0.010, 0.015, 0.002) for _ in range(every)]
    assert traced == [False] * (every - 1) + [True]
    # Then: (15 - 10 + 0.5 detaching) ms over 10 ms, not the 3 ms the hooks saw.
    assert abs(clock.every - (0.015 - 0.010 + 0.0005) / 0.010 / DEFAULT_BUDGET) < 1.01  # the clock's sums
    for _ in range(400):
        step(clock, fake, 0.010, 0.015, 0.002)
    traced_share = 1 / clock.every * (0.0055 / 0.010)
    assert traced_share <= DEFAULT_BUDGET


def test_the_hooks_time_is_the_floor_and_a_cheap_trace_traces_every_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, fake = tracing(monkeypatch)
    # A CPU job of 300 ms steps whose traced steps cost 0.2 ms: every step stays traced.
    for _ in range(50):
        assert step(clock, fake, 0.300, 0.3002, 0.0002)
    assert clock.every == 1
    # Steps that vary more than tracing costs: the hooks' time is the least a traced step costs.
    assert clock.traced_share(0.002, 0.009) == pytest.approx(HOOKS_SEEN_INVERSE * 0.002 / 0.007)
    clock.untraced.extend([0.010, 0.011, 0.012])
    assert clock.traced_share(0.002, 0.009) == pytest.approx(0.002 / 0.011)
