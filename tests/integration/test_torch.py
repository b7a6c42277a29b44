"""Torch features against real training jobs: trace, nan, and the model tables (CPU; the CUDA
paths run where a GPU is present and skip cleanly elsewhere)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, Iterator, List

import pytest

from probing.errors import ExitCode

from support import Target, probing, wait_until

torch = pytest.importorskip("torch")

SEED_QUERY = (
    "SELECT module, stage, avg(duration) as avg_time FROM python.torch_trace "
    "WHERE step > (SELECT max(step) - 5 FROM python.torch_trace) "
    "GROUP BY module, stage ORDER BY avg_time DESC LIMIT 10;"
)

# Every hook container torch has, per module and global; after `trace off` all must be as before.
HOOKS_LEFT = """
import torch
from torch.nn.modules import module as m
from torch.optim import optimizer as opt
names = ('_forward_hooks', '_forward_pre_hooks', '_backward_hooks', '_backward_pre_hooks',
         '_forward_hooks_always_called', '_forward_hooks_with_kwargs', '_forward_pre_hooks_with_kwargs')
per_module = sum(len(getattr(mod, n, {})) for mod in [*model.modules(), loss_fn] for n in names)
per_optimizer = sum(len(o._optimizer_step_pre_hooks) + len(o._optimizer_step_post_hooks) for o in optimizers)
glob = (len(m._global_forward_hooks) + len(m._global_forward_pre_hooks) + len(m._global_backward_hooks)
        + len(opt._global_optimizer_pre_hooks) + len(opt._global_optimizer_post_hooks))
print(per_module, per_optimizer, glob)
"""


def rows(pid: int, sql: str) -> List[Dict[str, Any]]:
    result = probing(str(pid), "query", sql, "--format", "json")
    assert result.returncode == 0, result.stderr
    found: List[Dict[str, Any]] = json.loads(result.stdout)
    return found


def status(pid: int, feature: str = "trace") -> Dict[str, Any]:
    result = probing(str(pid), feature, "status", "--format", "json")
    assert result.returncode == 0, result.stderr
    found: Dict[str, Any] = json.loads(result.stdout)
    return found


def wait_for_step(pid: int, step: int, timeout: float = 60.0) -> None:
    assert wait_until(lambda: status(pid)["step"] >= step, timeout, 0.2), status(pid)


def wait_for_more_steps(pid: int, steps: int, timeout: float = 60.0) -> None:
    """`steps` more steps from now: the step count goes on over the tests that share a job."""
    wait_for_step(pid, status(pid)["step"] + steps, timeout)


@pytest.fixture(scope="class")
def shared_slow_job() -> Iterator[Target]:
    # Started without the agent: the first probing command attaches.
    with Target("torch_job.py", via="plain", args=["--slow"]) as job:
        yield job


@pytest.fixture
def slow_job(shared_slow_job: Target) -> Iterator[Target]:
    """Each test gives the shared job back with tracing and NaN checks off: every hook gone
    (--no-attach: after the test that detaches there is nothing to switch off)."""
    yield shared_slow_job
    for feature in ("trace", "nan"):
        result = probing(str(shared_slow_job.pid), "--no-attach", feature, "off")
        assert result.returncode in (0, ExitCode.NO_AGENT), result.stderr


class TestOneSlowJob:
    """One `torch_job.py --slow` for these tests, in this order: the seed query's is the job's
    first `trace on` (python.torch_trace holds its rows alone); the test that detaches is last."""

    def test_seed_query_on_an_attached_job_ranks_the_slow_submodule_first(self, slow_job: Target) -> None:
        # Every step, as the step numbers below are read whole: left to choose, the tracer measures
        # this small job's hooks at about 1% of its 25 ms step, and traces one step in 1 or 2.
        result = probing(str(slow_job.pid), "trace", "on", "--every", "1")
        assert result.returncode == 0, result.stderr
        assert "trace on; 14 hooks added" in result.stdout  # 6 modules x 2 + 2 global optimizer hooks
        assert "models:     loss_fn, model (6 modules hooked" in result.stdout
        wait_for_step(slow_job.pid, 8)
        ranked = rows(slow_job.pid, SEED_QUERY)
        # model contains model.2, so it is slower still; the submodule is the first leaf.
        assert [row["module"] for row in ranked[:2]] == ["model", "model.2"]
        assert ranked[1]["stage"] == "forward" and ranked[1]["avg_time"] >= 0.019
        steps = rows(
            slow_job.pid, "SELECT step, count(*) AS n FROM python.torch_trace GROUP BY step ORDER BY step"
        )
        numbers = [row["step"] for row in steps]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        # a full step: 5 module forwards, loss_fn, the optimizer
        assert {row["n"] for row in steps[2:-1]} == {7}  # the first may be partial
        table = rows(slow_job.pid, "SELECT * FROM python.torch_trace WHERE module = 'optimizer' LIMIT 1")[0]
        assert table["module_type"] == "AdamW" and table["stage"] == "optimizer" and table["rank"] == 0
        assert table["allocated"] is None and table["reserved"] is None  # CPU: no CUDA memory figures
        assert slow_job.alive()

    def test_backward_timing_nests_inside_the_parent(self, slow_job: Target) -> None:
        job = slow_job
        assert probing(str(job.pid), "trace", "on", "--backward", "--every", "2").returncode == 0
        wait_for_more_steps(job.pid, 8)
        found = rows(
            job.pid,
            "SELECT step, module, duration FROM python.torch_trace WHERE stage = 'backward' "
            "ORDER BY step, seq",
        )
        steps = {row["step"] for row in found}
        assert steps and all(step % 2 == 0 for step in steps)  # --every 2
        last = sorted(steps)[-2]  # the newest may be in the middle of its backward pass
        durations = {row["module"]: row["duration"] for row in found if row["step"] == last}
        assert set(durations) == {"model", "model.0", "model.1", "model.2", "model.3", "loss_fn"}
        assert all(value > 0 for value in durations.values())
        assert durations["model"] >= max(durations[f"model.{i}"] for i in range(4))

    def test_trace_off_leaves_zero_hooks_and_the_job_runs_on(self, slow_job: Target) -> None:
        before = probing(str(slow_job.pid), "eval", HOOKS_LEFT)
        assert before.stdout == "0 0 0\n", before.stderr
        assert probing(str(slow_job.pid), "trace", "on", "--backward").returncode == 0
        assert probing(str(slow_job.pid), "nan", "on").returncode == 0
        during = probing(str(slow_job.pid), "eval", HOOKS_LEFT).stdout.split()
        assert during[0] != "0" and during[2] == "2"
        wait_for_more_steps(slow_job.pid, 3)
        off = probing(str(slow_job.pid), "trace", "off")
        assert "hooks kept for nan" in off.stdout
        off = probing(str(slow_job.pid), "nan", "off")
        assert off.returncode == 0 and "14 hooks removed" in off.stdout
        assert probing(str(slow_job.pid), "eval", HOOKS_LEFT).stdout == "0 0 0\n"
        # on again, then detach: the agent removes what it added on its way out
        assert probing(str(slow_job.pid), "trace", "on").returncode == 0
        assert probing(str(slow_job.pid), "detach").returncode == 0
        assert probing(str(slow_job.pid), "eval", HOOKS_LEFT).stdout == "0 0 0\n"
        step = int(probing(str(slow_job.pid), "eval", "model[2].calls").stdout)
        assert wait_until(lambda: int(probing(str(slow_job.pid), "eval", "model[2].calls").stdout) > step, 10)


def test_gradient_accumulation_and_two_optimizers_share_a_step() -> None:
    args = ["--accumulate", "3", "--two-optimizers"]
    with Target("torch_job.py", via="plain", args=args) as job:
        assert probing(str(job.pid), "trace", "on", "--every", "1").returncode == 0
        wait_for_step(job.pid, 5)
        found = rows(
            job.pid,
            "SELECT step, list(seq ORDER BY seq) AS seqs, count(*) FILTER (module = 'model') AS micro, "
            "list(module ORDER BY seq) FILTER (stage = 'optimizer') AS optimizers "
            "FROM python.torch_trace GROUP BY step ORDER BY step",
        )
        full = found[2:-1]  # the first steps may be partial: hooks went in mid-step
        assert full and all(row["micro"] == 3 for row in full)
        assert all(row["optimizers"] == ["optimizer", "head_optimizer"] for row in full)
        assert all(row["seqs"] == list(range(len(row["seqs"]))) for row in full)


def test_loss_is_bit_identical_traced_and_untraced() -> None:
    args = ["--steps", "40", "--print-losses"]
    with Target("torch_job.py", via="plain", args=args) as plain:
        assert wait_until(lambda: "done" in plain.stdout_lines, 60, 0.1)
        untraced = [line for line in plain.stdout_lines if line.startswith("loss")]
    environment = {"PROBING_TORCH_TRACE": "every=1,backward"}
    with Target("torch_job.py", via="env", args=args, env=environment) as job:
        assert wait_until(lambda: "done" in job.stdout_lines, 60, 0.1)
        traced = [line for line in job.stdout_lines if line.startswith("loss")]
        assert probing(str(job.pid), "nan", "status").returncode == 0
        counted = rows(
            job.pid, "SELECT count(DISTINCT step) AS steps, count(*) AS n FROM python.torch_trace"
        )[0]
    assert len(untraced) == 40 and traced == untraced
    assert counted["steps"] == 40 and counted["n"] > 40 * 10


def test_nan_events_name_the_layer_at_its_step_and_nothing_earlier() -> None:
    with Target("torch_job.py", via="plain", args=["--poison", "forward", "--gate", "--steps", "40"]) as job:
        result = probing(str(job.pid), "nan", "on")
        assert result.returncode == 0 and "nan checks: on" in result.stdout
        job.process.stdin.write(b"go\n")  # type: ignore[union-attr]
        job.process.stdin.flush()  # type: ignore[union-attr]
        assert wait_until(lambda: "done" in job.stdout_lines, 60, 0.1), job.output()
        events = rows(job.pid, "SELECT step, module, stage, nan_count, inf_count, input_finite, tensor "
                      "FROM python.nan_events ORDER BY step, seq")  # fmt: skip
        first = events[0]
        # Middle's 30th call is step 29, counted from 0; it alone made the NaN (its input was finite).
        assert (first["step"], first["module"], first["stage"], first["input_finite"]) == (
            29,
            "model.2",
            "forward",
            True,
        )
        # A NaN, uncounted: the check reduces the tensor to one value on its device (ledger.py).
        assert first["nan_count"] is None and first["inf_count"] is None
        assert first["tensor"] == "output[0] float32[32, 16] on cpu"
        assert len({event["step"] for event in events}) == len(events)  # the first event of each step only
        seed = rows(
            job.pid, "SELECT step, module, stage, nan_count FROM python.nan_events ORDER BY step, seq LIMIT 5"
        )
        assert seed[0] == {"step": 29, "module": "model.2", "stage": "forward", "nan_count": None}
        assert status(job.pid, "nan")["nan_events"] == len(events)
        assert job.alive()


def first_nan_event(args: List[str]) -> Dict[str, Any]:
    """A gated torch_job.py run with `nan on` until it is done: the first python.nan_events row."""
    with Target("torch_job.py", via="plain", args=[*args, "--gate"]) as job:
        assert probing(str(job.pid), "nan", "on").returncode == 0
        job.process.stdin.write(b"go\n")  # type: ignore[union-attr]
        job.process.stdin.flush()  # type: ignore[union-attr]
        assert wait_until(lambda: "done" in job.stdout_lines, 60, 0.1), job.output()
        first = rows(job.pid, "SELECT * FROM python.nan_events ORDER BY step, seq LIMIT 1")[0]
        assert job.alive()
        return first


def test_nan_in_backward_is_blamed_on_the_module_that_made_it() -> None:
    first = first_nan_event(["--poison", "backward", "--steps", "35"])
    assert (first["step"], first["module"], first["stage"], first["input_finite"]) == (
        29,
        "model.2",
        "backward",
        True,
    )
    assert first["tensor"].startswith("grad_input[0] float32[32, 16]")


def test_nan_stop_raises_in_the_training_thread_so_the_job_handles_it() -> None:
    with Target("torch_job.py", via="plain", args=["--poison", "forward", "--gate"]) as job:
        result = probing(str(job.pid), "nan", "on", "--stop")
        assert "--stop: raise at the first NaN/Inf" in result.stdout
        job.process.stdin.write(b"go\n")  # type: ignore[union-attr]
        job.process.stdin.flush()  # type: ignore[union-attr]
        assert wait_until(lambda: any(line.startswith("stopped") for line in job.stdout_lines), 60, 0.1)
        line = next(line for line in job.stdout_lines if line.startswith("stopped"))
        assert line.startswith("stopped at step 29: checkpoint saved; NonFiniteError: probing: NaN in the ")
        assert "of model.2 (Middle) at step 29" in line
        # Raised as the step ended, before the optimizer's update: the NaN loss never reached them.
        assert wait_until(lambda: "weights finite: True" in job.stdout_lines, 10, 0.1), job.output()
        assert status(job.pid, "nan")["stopped_at_step"] == 29
        assert job.alive()  # the job's own handler chose to stop training, not to die


def test_model_tables_match_the_known_model() -> None:
    # Trained 5 steps, then idle: gradients are there (zero_grad sets them to None each step).
    with Target("torch_job.py", via="plain", args=["--two-optimizers", "--steps", "5"]) as job:
        assert wait_until(lambda: "done" in job.stdout_lines, 60, 0.1), job.output()
        modules = {row["name"]: row for row in rows(job.pid, "SELECT * FROM python.modules")}
        assert set(modules) == {"model", "model.0", "model.1", "model.2", "model.3", "loss_fn"}
        assert modules["model"]["params"] == (8 * 16 + 16) + (16 * 4 + 4)
        assert modules["model.0"] | {"grad_norm": None} == {
            "name": "model.0", "root": "model", "type": "Linear", "depth": 1, "params": 144,
            "trainable_params": 144, "device": "cpu", "dtype": "float32", "training": True,
            "grad_norm": None, "has_nonfinite_grad": False, "traced": False,
        }  # fmt: skip
        assert modules["model.0"]["grad_norm"] > 0
        assert modules["model.1"]["grad_norm"] is None and modules["model.1"]["params"] == 0
        seed = rows(job.pid, "SELECT name, type, params, grad_norm FROM python.modules ORDER BY params DESC")
        assert [row["name"] for row in seed[:2]] == ["model", "model.0"]

        optimizers = rows(job.pid, "SELECT * FROM python.optimizers ORDER BY optimizer")
        assert [row["optimizer"] for row in optimizers] == ["head_optimizer", "optimizer"]
        head, sgd = optimizers
        assert (head["type"], head["lr"], head["beta1"], head["beta2"], head["weight_decay"]) == (
            "AdamW", 0.001, 0.9, 0.95, 0.01,
        )  # fmt: skip
        assert (head["params"], head["numel"], head["momentum"]) == (2, 68, None) and head["steps"] > 0
        assert (sgd["type"], sgd["lr"], sgd["momentum"], sgd["beta1"], sgd["params"], sgd["numel"]) == (
            "SGD", 0.01, 0.9, None, 2, 144,
        )  # fmt: skip

        tensors = rows(job.pid, "SELECT * FROM python.tensors")
        named = {row["name"]: row for row in tensors if row["name"]}
        assert named["model.0.weight"] == {
            "name": "model.0.weight", "kind": "parameter", "shape": "[16, 8]", "dtype": "float32",
            "device": "cpu", "bytes": 512, "requires_grad": True, "is_param": True, "grad_fn": None,
            "held_by": None,  # named by the model: no holder needed
        }  # fmt: skip
        assert named["model.0.weight.grad"]["kind"] == "gradient"
        marker = [row for row in tensors if row["shape"] == "[123, 45]"]
        assert len(marker) == 1 and marker[0]["kind"] == "tensor" and marker[0]["bytes"] == 123 * 45 * 4
        assert marker[0]["held_by"] == "__main__.marker"
        seed = rows(
            job.pid,
            "SELECT shape, dtype, device, count(*) AS n, sum(bytes) AS bytes FROM python.tensors "
            "GROUP BY ALL ORDER BY bytes DESC",
        )
        assert seed[0]["shape"] == "[123, 45]"


def test_torch_commands_on_a_job_without_torch_and_bad_options() -> None:
    with Target("sleeper.py", via="plain") as job:
        for command in (["trace", "on"], ["nan", "on"], ["trace", "status"]):
            result = probing(str(job.pid), *command)
            assert result.returncode == ExitCode.NO_TORCH, result.stderr
            assert "has not imported torch" in result.stderr and "Traceback" not in result.stderr
        # the torch tables exist, and are empty
        assert rows(job.pid, "SELECT count(*) AS n FROM python.torch_trace")[0]["n"] == 0
        assert rows(job.pid, "SELECT count(*) AS n FROM python.modules")[0]["n"] == 0
        usage = probing(str(job.pid), "trace", "off", "--every", "3")
        assert usage.returncode == ExitCode.USAGE and "only go with 'trace on'" in usage.stderr
        assert probing(str(job.pid), "trace", "sideways").returncode == ExitCode.USAGE
        assert probing(str(job.pid), "trace", "on", "--every", "0").returncode == ExitCode.USAGE
        assert probing(str(job.pid), "nan", "off", "--stop").returncode == ExitCode.USAGE
        assert job.alive()


@pytest.fixture(scope="class")
def plain_job() -> Iterator[Target]:
    with Target("torch_job.py", via="plain") as job:
        yield job


class TestOnePlainJob:
    """One `torch_job.py` with no options for these tests, in this order."""

    def test_a_tensor_scan_cut_short_says_so(self, plain_job: Target) -> None:
        job = plain_job
        probing(str(job.pid), "eval", "junk = [object() for _ in range(300000)]")
        result = probing(
            str(job.pid), "query", "SELECT count(*) FROM python.tensors", "--scan-budget", "0.000001"
        )
        assert result.returncode == 0
        assert "python.tensors: stopped after 1e-06 s" in result.stderr

    def test_modules_and_depth_narrow_what_is_hooked(self, plain_job: Target) -> None:
        job = plain_job  # traced here first: python.torch_trace holds this test's rows alone
        result = probing(str(job.pid), "trace", "on", "--modules", "model.[23]", "--format", "json")
        assert json.loads(result.stdout)["hooked_modules"] == 2
        wait_for_more_steps(job.pid, 3)
        assert {r["module"] for r in rows(job.pid, "SELECT DISTINCT module FROM python.torch_trace")} == {
            "model.2", "model.3", "optimizer",
        }  # fmt: skip
        result = probing(str(job.pid), "trace", "on", "--depth", "0", "--format", "json")
        assert json.loads(result.stdout)["models"] == ["loss_fn", "model"]
        assert json.loads(result.stdout)["hooked_modules"] == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_durations_and_memory_columns() -> None:
    with Target("torch_job.py", via="plain", args=["--device", "cuda", "--slow"]) as job:
        assert probing(str(job.pid), "trace", "on", "--every", "1", "--backward").returncode == 0
        wait_for_step(job.pid, 6)
        found = rows(
            job.pid, "SELECT * FROM python.torch_trace WHERE module = 'model.0' AND stage = 'forward'"
        )
        assert found and all(row["duration"] > 0 and row["allocated"] is not None for row in found)
        assert all(row["reserved"] >= row["allocated"] for row in found)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nan_on_a_cuda_device_names_the_layer_at_its_step() -> None:
    first = first_nan_event(["--device", "cuda", "--poison", "forward", "--steps", "40"])
    assert (first["step"], first["module"], first["stage"], first["input_finite"]) == (
        29,
        "model.2",
        "forward",
        True,
    )
    assert first["nan_count"] is None and first["inf_count"] is None
    assert first["tensor"] == "output[0] float32[32, 16] on cuda:0"


STOP_HOOKS = """
import torch
from torch.optim import optimizer as opt
from probing.agent import lifecycle
from probing.agent.pytorch import safepoint, tracer as torchtrace
def global_hooks():
    return len(opt._global_optimizer_pre_hooks) + len(opt._global_optimizer_post_hooks)
model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
active = torchtrace.tracer()
active.configure_trace(1, False, None, None, None)
safepoint.read_safely(torch, (), lambda: None, 0.0)  # no step comes: installs the gate, reads here
print(active.hook_count(), global_hooks(), safepoint._gate.handle is not None)
print(lifecycle.run_stop_hooks())
print(active.hook_count(), global_hooks(), safepoint._gate.handle is not None)
torchtrace.stop()
safepoint.stop()
print(active.hook_count(), global_hooks())
"""


def test_the_tracer_and_the_safe_point_undo_their_hooks_through_the_agents_stop_hooks() -> None:
    """The tracer and the safe-point gate register their own stop hooks when they hook the job;
    running them removes every hook, and running them again changes nothing."""
    result = subprocess.run([sys.executable, "-c", STOP_HOOKS], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["4 3 True", "[]", "0 0 False", "0 0"]
