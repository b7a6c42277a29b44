"""A name read from a per-step function's frame reads the running step's value at each use,
and the eval keeps no returned step alive (review-b finding 2).

tests/targets/per_step.py: train_step(i) holds `loss = float(i)` and a Payload tracked in
`alive`, then waits for `advance`; the eval lets the job take a step while it runs.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from support import Target, interpreter_params, probing

TAKE_A_STEP = "step_taken.clear(); advance.set(); assert step_taken.wait(20)\n"


@pytest.fixture(scope="module", params=interpreter_params())
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    with Target("per_step.py", python=request.param) as started:
        yield started


def test_a_loop_over_a_per_step_local_sees_each_step_and_keeps_none_alive(target: Target) -> None:
    code = "first = loss\n" + TAKE_A_STEP + "import gc\ngc.collect()\nprint(first, loss, len(alive))"
    result = probing(str(target.pid), "eval", code)
    assert result.returncode == 0, result.stderr
    first, then, payloads = result.stdout.split()
    assert float(then) == float(first) + 1
    assert payloads == "1"  # the running step's only
