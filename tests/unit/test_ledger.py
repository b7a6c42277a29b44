"""The NaN checks' step ledger (agent/pytorch/ledger.py) on real CPU tensors: the CUDA path's
batching run on the CPU (`batch_cpu`), which findings a step's values give, and what is left
unread."""

from __future__ import annotations

import threading
import weakref
from typing import Any, List

import pytest

from probing.agent.pytorch import ledger as ledger_module
from probing.agent.pytorch.clock import StepClock
from probing.agent.pytorch.ledger import BATCH, StepLedger
from probing.agent.pytorch.nonfinite import NanChecks

torch = pytest.importorskip("torch")


class Module:
    def __init__(self, name: str) -> None:
        self.name = name


def verdict(found: Any) -> Any:
    """(module, stage, held a NaN, inputs finite, tensor) of a finding, or None."""
    if found is None:
        return None
    return (found.check.traced.name, found.stage, found.nan, found.inputs_finite, found.tensor)


def ledgers() -> List[StepLedger]:
    immediate, batched = StepLedger(torch), StepLedger(torch)
    batched.batch_cpu = True
    return [immediate, batched]


@pytest.mark.parametrize("ledger", ledgers(), ids=["aminmax", "batched"])
def test_the_first_forward_output_not_finite_is_the_finding_with_its_inputs(ledger: StepLedger) -> None:
    data = torch.ones(4, 3)
    first = torch.ones(4, 3) * 2
    second = first * float("nan")
    third = second + 1
    ledger.add(Module("a"), 0, 0, [first], [data])
    ledger.add(Module("b"), 0, 1, [second], [first])
    ledger.add(Module("c"), 0, 2, [third], [second])
    found = ledger.settle()
    assert verdict(found) == ("b", "forward", True, True, "output[0] float32[4, 3] on cpu")
    assert ledger.reads == 1 and ledger.settle() is None  # forgotten once read


@pytest.mark.parametrize("ledger", ledgers(), ids=["aminmax", "batched"])
def test_infs_alone_and_a_tensor_met_again_reduced_once(ledger: StepLedger) -> None:
    shared = torch.tensor([1.0, float("inf")])
    ledger.add(Module("a"), 0, 0, [shared], [])
    ledger.add(Module("container"), 0, 1, [shared], [])  # a Sequential returns its child's output
    per_tensor = 1 if ledger.batch_cpu else 2
    assert ledger.count == per_tensor
    found = ledger.settle()
    assert found is not None and (found.check.traced.name, found.nan) == ("a", False)


def test_a_batch_is_reduced_at_its_size_and_a_tensor_written_in_place_meanwhile_is_left_unread() -> None:
    ledger = ledgers()[1]
    tensors = [torch.ones(2) for _ in range(BATCH - 1)]
    for index, tensor in enumerate(tensors):
        ledger.add(Module(f"m{index}"), 0, index, [tensor], [])
    assert len(ledger.batched) == BATCH - 1
    tensors[3].mul_(float("nan"))  # after its check: what the module returned was finite
    ledger.add(Module("last"), 0, BATCH, [torch.ones(2)], [])
    assert ledger.batched == []  # the BATCH-th tensor reduced the lot
    assert ledger.settle() is None


def test_a_batch_waits_no_longer_than_its_bytes_allow() -> None:
    ledger = ledgers()[1]
    big = torch.ones(ledger_module.BATCH_BYTES // 4 + 1)
    ledger.add(Module("big"), 0, 0, [big], [])
    assert ledger.batched == [] and ledger.batched_bytes == 0


def backward_step(ledger: StepLedger, between_modules: bool) -> Any:
    """a -> b -> c forward; c's gradient finite, then NaN at the output of a (or of an operation
    between a and b): b's backward made it."""
    data = torch.ones(2, 2)
    out_a = data * 2
    given_b = out_a * 1 if between_modules else out_a
    out_b = given_b + 1
    out_c = out_b - 1
    a, b, c = (
        ledger.add(Module("a"), 0, 0, [out_a], [data]),
        ledger.add(Module("b"), 0, 1, [out_b], [given_b]),
        (ledger.add(Module("c"), 0, 2, [out_c], [out_b])),
    )
    assert a is not None and b is not None and c is not None
    ledger.add_gradient(c, (torch.ones(2, 2),))
    ledger.add_gradient(b, (torch.ones(2, 2),))
    ledger.add_gradient(a, (torch.full((2, 2), float("nan")),))
    return ledger.settle()


@pytest.mark.parametrize("ledger", ledgers(), ids=["aminmax", "batched"])
def test_a_nan_made_in_backward_is_blamed_on_the_module_that_fed_it_on(ledger: StepLedger) -> None:
    found = backward_step(ledger, between_modules=False)
    assert verdict(found) == ("b", "backward", True, True, "grad_input[0] float32[2, 2] on cpu")


def test_where_an_operation_between_modules_took_the_output_the_module_checked_before_is_blamed() -> None:
    found = backward_step(ledgers()[0], between_modules=True)
    assert (found.check.traced.name, found.stage) == ("b", "backward")
    assert found.tensor == "grad_input float32[2, 2] on cpu"


def test_nan_off_lets_go_of_the_tensors_waiting_in_the_batch() -> None:
    checks = NanChecks(StepClock(torch, threading.RLock()))
    checks.begin()
    checks.ledger.batch_cpu = True
    tensor = torch.ones(3)
    checks.ledger.add(Module("a"), 0, 0, [tensor], [])
    assert len(checks.ledger.batched) == 1
    held = weakref.ref(tensor)
    del tensor
    assert held() is not None  # the batch holds it until it is reduced
    checks.end()
    assert held() is None and checks.ledger.batched == []
