"""What tracing and NaN checks cost a step, counted where a GPU would pay it (tests/targets/torch_cost.py,
on the CPU): the probing hooks an untraced step runs, and the host reads (each a wait for the
device on CUDA) a step with NaN checks makes."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict

import pytest

from support import TARGETS

pytest.importorskip("torch")


def measured(what: str) -> Dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(TARGETS / "torch_cost.py"), what], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_an_untraced_step_runs_the_step_hooks_alone_whatever_the_model() -> None:
    """With one step in four traced, the three between run four hook entries (the model's and the
    optimizer's, before and after), the same for 17 modules as for 65; a traced step runs two
    for each module."""
    report = measured("hooks")
    for blocks, model in report.items():
        steps = model["steps"]
        assert [step["traced"] for step in steps] == [step["step"] % 4 == 0 for step in steps], blocks
        untraced = [step["entries"] for step in steps if not step["traced"]]
        traced = [step["entries"] for step in steps if step["traced"]]
        assert len(untraced) >= 5 and set(untraced) == {4}, (blocks, steps)
        assert traced and min(traced) >= 2 * model["modules"], (blocks, steps)


def test_nan_checks_read_the_device_once_a_step_and_still_name_the_module_that_made_it() -> None:
    """A clean step reads its checks back once (one copy, before the update); a step with a
    finding reads once more, for the blamed module's weights. The finding is what the checks that
    read each tensor in its hook found: the poisoned module, at its step, from finite inputs, in
    the forward pass or the backward (the gradient it sent on, or its weight's alone)."""
    report = measured("reads")
    for stage, found in report.items():
        steps = found["steps"]
        assert all(step["start_check_done"] for step in steps), steps
        first = found["first_event"]
        assert first["step"] % 8 == 5, first
        # The first step also made the start check of the weights (a read a module).
        assert [step["reads"] for step in steps[1:]] == [
            2 if step["step"] == first["step"] else 1 for step in steps[1:]
        ]
        assert (first["module"], first["module_type"], first["stage"], first["input_finite"]) == (
            "net.3.2", "Poison", "forward" if stage == "forward" else "backward", True,
        )  # fmt: skip
        expected = {"forward": "output[0] float32[4, 8]", "backward": "grad_input[0] float32[4, 8]",
                    "weight": "net.3.2.weight.grad float32[8]"}[stage]  # fmt: skip
        assert first["tensor"] == f"{expected} on cpu"
        assert first["weights_finite"] is True
