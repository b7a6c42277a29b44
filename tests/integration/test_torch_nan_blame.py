"""NaN blame when the checks begin after the fact (issue 26, item 2).

`nan on` is usually typed once the loss is NaN, when an optimizer step has often written NaN into
the weights already: every later step's first NaN is then made by the first module with finite
inputs, and blaming it points away from the cause. These jobs have weights that went NaN before
the checks, weights that go NaN after them, and checks armed from the start (PROBING_NAN=1).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest

from support import Target, probing, wait_until

torch = pytest.importorskip("torch")

EVENTS = (
    "SELECT step, module, stage, input_finite, weights_finite, weights_already_nonfinite "
    "FROM python.nan_events ORDER BY step, seq"
)


def rows(pid: int, sql: str) -> List[Dict[str, Any]]:
    result = probing(str(pid), "query", sql, "--format", "json")
    assert result.returncode == 0, result.stderr
    found: List[Dict[str, Any]] = json.loads(result.stdout)
    return found


def nan_status(pid: int) -> Dict[str, Any]:
    result = probing(str(pid), "nan", "status", "--format", "json")
    assert result.returncode == 0, result.stderr
    found: Dict[str, Any] = json.loads(result.stdout)
    return found


def say_go(job: Target) -> None:
    job.process.stdin.write(b"go\n")  # type: ignore[union-attr]
    job.process.stdin.flush()  # type: ignore[union-attr]


def test_weights_nan_before_nan_on_are_named_as_the_cause_not_the_module_that_ran_them() -> None:
    """model.2's weight is NaN (and no other) when `nan on` comes; training then spreads it."""
    args = ["--nan-weight-at", "5", "--gate", "--steps", "12"]
    with Target("nan_weights.py", via="plain", args=args) as job:
        on = probing(str(job.pid), "nan", "on")
        assert on.returncode == 0, on.stderr
        # The job waits on stdin: no module runs, so nothing reads the weights from the agent's thread.
        assert "weights:    not checked yet: the job called no hooked module within 1 s" in on.stdout
        say_go(job)
        assert wait_until(lambda: "done" in job.stdout_lines, 60, 0.1), job.output()
        events = rows(job.pid, EVENTS)
        assert events[0] == {"step": 0, "module": "model.2", "stage": "forward", "input_finite": True,
                             "weights_finite": False, "weights_already_nonfinite": True}  # fmt: skip
        # Step 0's update spread the NaN into model.0, after the checks began: not "already".
        assert events[1] == {"step": 1, "module": "model.0", "stage": "forward", "input_finite": True,
                             "weights_finite": False, "weights_already_nonfinite": False}  # fmt: skip
        weights = nan_status(job.pid)["nan_session"]["weights"]
        assert weights["state"] == "done" and weights["modules"] == ["model.2"]
        assert [finding["name"] for finding in weights["nonfinite"]] == ["model.2.weight"]
        assert weights["nonfinite"][0]["nan_count"] == 1
        text = probing(str(job.pid), "nan", "status").stdout
        assert (
            "  weights:    the weights of model.2 were already NaN/Inf when checks began (the cause is "
            "earlier): model.2.weight (1 NaN)\n" in text
        )
        assert (
            "  first NaN/Inf: step 0, model.2 (Linear) forward output[0] float32[32, 16] on cpu (NaN): "
            "the weights of model.2 were already NaN/Inf when checks began (the cause is earlier)\n" in text
        )
        assert "  earlier:    nothing in this process shows when" in text
        assert job.alive()


def test_nan_on_after_the_nan_spread_says_so_instead_of_blaming_the_first_module() -> None:
    """The issue's job: by `nan on` every weight is NaN, and model.0 makes the first NaN each step."""
    with Target("nan_weights.py", via="plain", args=["--nan-weight-at", "5", "--ready-at", "8"]) as job:
        assert probing(str(job.pid), "nan", "on").returncode == 0
        assert wait_until(lambda: nan_status(job.pid)["nan_session"]["weights"]["state"] == "done", 30, 0.1)
        assert wait_until(lambda: nan_status(job.pid)["nan_events"] >= 3, 30, 0.1)
        # Step 0 was under way when the hooks went in: its first hooked module may have had NaN
        # inputs already. Every whole step's first NaN is model.0's, from its weights.
        whole_steps = [event for event in rows(job.pid, EVENTS) if event["step"] >= 1]
        assert whole_steps and all(
            (
                event["module"],
                event["input_finite"],
                event["weights_finite"],
                event["weights_already_nonfinite"],
            )
            == ("model.0", True, False, True)
            for event in whole_steps
        ), whole_steps
        text = probing(str(job.pid), "nan", "status").stdout
        assert (
            "  weights:    the weights of model.0, model.2 and model.4 were already NaN/Inf when checks "
            "began (the cause is earlier): model.0.weight (128 NaN), model.0.bias (16 NaN), "
            "model.2.weight (256 NaN), model.2.bias (16 NaN) and 2 more\n" in text
        )
        assert job.alive()


def test_a_job_that_goes_nan_after_the_checks_began_is_blamed_where_it_happens() -> None:
    """model.2 (Middle) outputs NaN from its 30th call: it made it, from finite inputs and weights;
    the next steps' model.0 has NaN weights that an update wrote after the checks began."""
    args = ["--poison", "forward", "--gate", "--steps", "35"]
    with Target("torch_job.py", via="plain", args=args) as job:
        assert probing(str(job.pid), "nan", "on").returncode == 0
        say_go(job)
        assert wait_until(lambda: "done" in job.stdout_lines, 60, 0.1), job.output()
        events = rows(job.pid, EVENTS)
        assert events[0] == {"step": 29, "module": "model.2", "stage": "forward", "input_finite": True,
                             "weights_finite": True, "weights_already_nonfinite": False}  # fmt: skip
        assert events[1] == {"step": 30, "module": "model.0", "stage": "forward", "input_finite": True,
                             "weights_finite": False, "weights_already_nonfinite": False}  # fmt: skip
        text = probing(str(job.pid), "nan", "status").stdout
        assert "  weights:    finite when checks began (4 tensors checked by step 0)\n" in text
        assert (
            "  first NaN/Inf: step 29, model.2 (Middle) forward output[0] float32[32, 16] on cpu (NaN): "
            "model.2 made it from finite inputs and finite weights (its own computation)\n" in text
        )
        assert "earlier:" not in text  # the cause is not before the checks
        assert job.alive()


def test_probing_nan_arms_the_checks_from_the_start_and_catches_the_first_bad_step() -> None:
    env = {"PROBING_NAN": "1"}
    with Target("torch_job.py", via="env", args=["--poison", "forward", "--steps", "35"], env=env) as job:
        assert wait_until(lambda: "done" in job.stdout_lines, 60, 0.1), job.output()
        status = nan_status(job.pid)
        assert status["nan"] is True and status["error"] is None
        assert status["nan_session"]["weights"]["state"] == "done"
        assert status["nan_session"]["weights"]["nonfinite"] == []
        first = rows(job.pid, EVENTS)[0]
        assert first == {"step": 29, "module": "model.2", "stage": "forward", "input_finite": True,
                         "weights_finite": True, "weights_already_nonfinite": False}  # fmt: skip
        assert job.alive()


def test_probing_nan_stop_under_probing_run_with_tracing_too_stops_at_the_first_bad_step() -> None:
    """`PROBING_NAN=stop probing run -- ...` beside PROBING_TORCH_TRACE=1: both start at the job's
    `import torch` (one finder serves both), and NonFiniteError reaches the job's own handler at
    the step the NaN was made, saying nothing about weights (they were finite)."""
    env = {"PROBING_NAN": "stop", "PROBING_TORCH_TRACE": "1"}
    with Target("torch_job.py", via="run", args=["--poison", "forward", "--steps", "35"], env=env) as job:
        assert wait_until(lambda: any(line.startswith("stopped") for line in job.stdout_lines), 60, 0.1), (
            job.output()
        )
        stopped = next(line for line in job.stdout_lines if line.startswith("stopped"))
        assert stopped == (
            "stopped at step 29: checkpoint saved; NonFiniteError: probing: NaN in the forward "
            "output[0] of model.2 (Middle) at step 29; stopped by `probing nan on --stop`"
        )
        status = nan_status(job.pid)
        assert (status["trace"], status["stopped_at_step"], status["error"]) == (True, 29, None)
        traced = rows(job.pid, "SELECT count(DISTINCT step) AS steps FROM python.torch_trace")[0]
        assert traced["steps"] > 0  # one step in N: the tracer keeps its cost under 1%
