"""Looking at a busy job must not hurt it: model-table queries while it trains, eval and detach
while it prints, hooks edited while it steps. Each test runs against a job that checks its own
results every step (tests/targets/selfcheck.py) and is bounded in requests and time."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, List

import pytest

from support import Target, probing, wait_until

torch = pytest.importorskip("torch")

MODEL_TABLE_SQL = (
    "SELECT name, params, grad_norm FROM python.modules",
    "SELECT name, kind, shape, grad_fn FROM python.tensors",
    "SELECT optimizer, lr, beta1, steps FROM python.optimizers",
)


def finish_unharmed(job: Target) -> None:
    """The job is alive, its checks never failed, and it exits cleanly when told to."""
    assert job.alive(), job.output()
    assert job.finish() == 0, job.output()
    assert any(line.endswith(" ok") and line.startswith("steps") for line in job.stdout_lines), job.output()
    assert not any("MISMATCH" in line for line in job.stderr_lines), job.output()


def test_concurrent_model_table_queries_during_training_leave_the_job_unharmed() -> None:
    """Four clients query python.modules, python.tensors and python.optimizers in a loop while
    the job trains; each gradient norm is read in the training thread at an optimizer step."""
    with Target("selfcheck.py", via="env", args=["--torch"]) as job:
        failures: List[str] = []
        norms: List[Any] = []
        deadline = time.monotonic() + 40

        def client(number: int) -> None:
            for request in range(12):
                if time.monotonic() > deadline or not job.alive():
                    return
                sql = MODEL_TABLE_SQL[(number + request) % len(MODEL_TABLE_SQL)]
                result = probing(str(job.pid), "query", sql, "--format", "json", timeout=60)
                if result.returncode != 0:
                    failures.append(f"{sql}: exit {result.returncode}: {result.stderr}")
                elif "python.modules" in sql:
                    norms.extend(row["grad_norm"] for row in json.loads(result.stdout))

        clients = [threading.Thread(target=client, args=(number,)) for number in range(4)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(90)
        assert not failures, failures
        # Read at a step boundary: every Linear has a gradient there, and it is finite.
        assert norms and all(norm is None or norm > 0 for norm in norms)
        assert sum(norm is not None for norm in norms) >= len(norms) // 2
        finish_unharmed(job)


def test_gradients_of_an_idle_job_are_read_while_it_is_quiet() -> None:
    """A job that trained and then waits (no step comes) still shows its gradients: nothing in
    autograd or an optimizer is running, so the agent reads them from its own thread."""
    with Target("torch_job.py", via="plain", args=["--steps", "3"]) as job:
        assert wait_until(lambda: "done" in job.stdout_lines, 60, 0.1), job.output()
        result = probing(
            str(job.pid), "query", "SELECT name, grad_norm FROM python.modules", "--format", "json"
        )
        assert result.returncode == 0, result.stderr
        norms = {row["name"]: row["grad_norm"] for row in json.loads(result.stdout)}
        assert norms["model.0"] > 0 and "left NULL" not in result.stderr


def test_gradients_are_not_read_while_a_thread_is_in_backward() -> None:
    """A thread parked inside a backward pass (a hook that waits) is where the engine writes
    gradients: the agent leaves them NULL and says why, and the job goes on once released."""
    script = (
        "import threading, torch\n"
        "gate = threading.Event()\n"
        "model = torch.nn.Linear(4, 4)\n"
        "def park(grad):\n"
        "    gate.wait()\n"
        "    return grad\n"
        "out = model(torch.randn(2, 4))\n"
        "out.register_hook(park)\n"
        "worker = threading.Thread(target=lambda: out.sum().backward(), name='backward')\n"
        "worker.start()\n"
    )
    with Target("torch_job.py", via="plain", args=["--steps", "1"]) as job:
        assert wait_until(lambda: "done" in job.stdout_lines, 60, 0.1), job.output()
        assert probing(str(job.pid), "eval", script).returncode == 0
        assert wait_until(
            lambda: "backward" in probing(str(job.pid), "backtrace", "--format", "json").stdout, 20, 0.2
        )
        result = probing(
            str(job.pid), "query", "SELECT name, grad_norm FROM python.modules", "--step-wait", "0.2"
        )
        assert result.returncode == 0, result.stderr
        assert "grad_norm and has_nonfinite_grad left NULL" in result.stderr
        assert "backward in torch/" in result.stderr
        assert probing(
            str(job.pid), "eval", "gate.set(); worker.join(10); worker.is_alive()"
        ).stdout.strip() == ("False")
        assert job.alive()


@pytest.mark.parametrize("cycles", [20])
def test_eval_then_detach_on_a_printing_job_never_crashes_it(cycles: int) -> None:
    """A detach after eval put back the job's stdout while its main thread was inside print():
    the proxy print held a borrowed reference to was freed under it (SIGSEGV, 1 run in 2)."""
    with Target("selfcheck.py", via="plain", args=["--print", "--spin"]) as job:
        for cycle in range(cycles):
            evaluated = probing(str(job.pid), "eval", "print('from eval'); step")
            assert evaluated.returncode == 0, evaluated.stderr
            assert "from eval" in evaluated.stdout
            detached = probing(str(job.pid), "detach")
            assert detached.returncode == 0, detached.stderr
            assert job.alive(), f"died in cycle {cycle}: {job.output()[-2000:]}"
        finish_unharmed(job)
        lines = [int(line.split()[1]) for line in job.stdout_lines if line.startswith("line ")]
        assert lines == list(range(len(lines))), "the job's own output lost or garbled lines"
        assert not any("from eval" in line for line in job.stdout_lines)


def test_trace_switched_on_and_off_while_training_leaves_the_job_unharmed() -> None:
    """Global optimizer hooks are iterated live by torch: adding or removing one from the
    agent's thread in the middle of a step raised in the job. They are edited in the training
    thread now."""
    with Target("selfcheck.py", via="env", args=["--torch"]) as job:
        for _ in range(12):
            for switch in ("on", "off"):
                result = probing(str(job.pid), "trace", switch)
                assert result.returncode == 0, result.stderr
            assert job.alive(), job.output()
        status: Dict[str, Any] = json.loads(
            probing(str(job.pid), "trace", "status", "--format", "json").stdout
        )
        assert status["error"] is None and status["hooks"] == 0
        finish_unharmed(job)
