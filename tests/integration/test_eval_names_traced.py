"""A job that traces the threads it starts (threading.settrace/setprofile) still answers, and
the agent's threads run none of its tracers (review-b finding 1).

threading installs those hooks in every thread started after them, the agent's included: the
job's tracer then ran in the agent's threads, a job with a line tracer never got its `hello`
answered, and on 3.11 the frame reader could hand the GIL over mid-read (a crash).
"""

from __future__ import annotations

import re
from typing import Iterator

import pytest

from support import Target, interpreter_params, probing


@pytest.fixture(scope="module", params=interpreter_params())
def python(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


@pytest.mark.parametrize("via", ["run", "plain"])  # the agent started with the job, or attached later
def test_a_traced_job_answers_and_its_tracers_never_run_in_the_agent(python: str, via: str) -> None:
    with Target("traced_trainer.py", python=python, via=via) as job:
        backtrace = probing(str(job.pid), "backtrace")
        assert backtrace.returncode == 0, backtrace.stderr
        assert "train" in backtrace.stdout
        hooks = probing(str(job.pid), "eval", "import sys\n(sys.gettrace(), sys.getprofile())")
        assert (hooks.returncode, hooks.stdout) == (0, "(None, None)\n"), hooks.stderr
        loss = probing(str(job.pid), "eval", "loss * 4")
        assert (loss.returncode, loss.stdout) == (0, "1.0\n"), loss.stderr
        assert re.search(r"^probing: loss: local of train\(\) at traced_trainer\.py:\d+", loss.stderr, re.M)
        assert job.alive()


def test_an_eval_cut_by_its_timeout_leaves_a_traced_job_answering(python: str) -> None:
    """The interrupt that ends an eval past --timeout is taken by the eval's own thread, not
    withdrawn: a withdrawal left CPython <= 3.11's "pending" signal set for every thread, and on
    3.11 a traced job then spun and its agent answered no more (review D, finding 1)."""
    with Target("traced_trainer.py", python=python) as job:
        spun = probing(str(job.pid), "eval", "--timeout", "1", "while True: pass")
        assert spun.returncode == 7, spun.stderr
        after = probing(str(job.pid), "eval", "loss * 4", timeout=30)
        assert (after.returncode, after.stdout) == (0, "1.0\n"), after.stderr
        assert probing(str(job.pid), "backtrace", timeout=30).returncode == 0
        assert job.alive()
