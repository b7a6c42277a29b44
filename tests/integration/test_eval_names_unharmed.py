"""Reading a name from a running frame leaves the frame as it was, under every CPython.

`frame.f_locals` on 3.8-3.12 would leave a copy of the frame's locals in the frame, keeping
each value alive after the job has dropped it (framelocals.py): tests/targets/frame_payload.py
drops the object eval read and says whether it was freed.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from support import Target, interpreter_params, probing, wait_until


@pytest.fixture(params=interpreter_params())
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    with Target("frame_payload.py", python=request.param) as started:
        yield started


def verdict(target: Target) -> str:
    assert target.process.stdin is not None
    target.process.stdin.write(b"drop\n")
    target.process.stdin.flush()
    assert wait_until(lambda: len(target.stdout_lines) >= 2, timeout=10), target.output()
    return target.stdout_lines[1]


def test_a_value_eval_read_from_a_frame_is_freed_when_the_job_drops_it(target: Target) -> None:
    result = probing(str(target.pid), "eval", "type(payload).__name__")
    assert (result.returncode, result.stdout) == (0, "'Payload'\n"), result.stderr
    assert "probing: payload: local of hold() at frame_payload.py:" in result.stderr
    assert verdict(target) == "freed"


def test_a_frame_copied_for_frame_is_freed_when_the_job_drops_it(target: Target) -> None:
    result = probing(str(target.pid), "eval", "--frame", "MainThread:hold", "type(payload).__name__")
    assert (result.returncode, result.stdout) == (0, "'Payload'\n"), result.stderr
    assert verdict(target) == "freed"
