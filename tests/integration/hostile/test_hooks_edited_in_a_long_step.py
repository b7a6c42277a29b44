"""`trace on` and `trace off` edit torch's global optimizer hooks, which torch iterates as a live
OrderedDict: an edit from the agent's thread while the training thread is inside that loop
raises in the job. A job whose own pre-hook holds it there for 1.5 s a step (longer than the
agent waits for a module call) must come out of both unharmed, and traced."""

from __future__ import annotations

import json

from support import Target, probing, wait_until


def test_trace_on_and_off_while_the_job_sits_in_its_own_optimizer_hook() -> None:
    with Target("slow_step_hook.py", via="env") as job:
        for switch in ("on", "off", "on"):
            result = probing(str(job.pid), "trace", switch, timeout=120)
            assert result.returncode == 0, result.stdout + result.stderr + job.output()
            assert job.alive(), job.output()
        assert wait_until(lambda: sum(line.startswith("step ") for line in job.stdout_lines) >= 4, 30)
        status = json.loads(probing(str(job.pid), "trace", "status", "--format", "json").stdout)
        assert status["error"] is None and status["hooks"] > 0, status
        off = probing(str(job.pid), "trace", "off", timeout=120)
        assert off.returncode == 0, off.stderr
        assert job.alive(), job.output()
        assert "mutated during iteration" not in job.output()
