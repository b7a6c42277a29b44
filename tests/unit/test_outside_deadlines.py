"""How a command's --timeout is split on the paths that read a job from outside (engine/backtrace.py,
docs/decisions.md "What --timeout covers"), and what a read that runs out of time says."""

from __future__ import annotations

import os
import time
from typing import Iterator

import pytest

from probing.engine.backtrace import EARLY_LOOK_S, stacks_deadline
from probing.outside import pyspy, spawn


def test_a_read_from_outside_gets_the_commands_timeout_and_never_less_than_the_floor() -> None:
    assert pyspy.outside_budget(20.0) == 20.0
    assert pyspy.outside_budget(5.0) == 5.0
    assert pyspy.outside_budget(0.5) == pyspy.OUTSIDE_FLOOR_S == 3.0


@pytest.mark.parametrize("timeout", [0.5, 3.0, 20.0])
def test_the_deadline_of_many_reads_covers_attaching_the_agent_and_the_read_from_outside(
    timeout: float,
) -> None:
    """`--ranks` stops waiting for a rank at this deadline: it must not come before the rank's
    own read from outside has had its share of --timeout."""
    attach = 5.0
    agent = max(timeout, EARLY_LOOK_S + pyspy.OUTSIDE_FLOOR_S)  # the look within it gets the floor
    assert stacks_deadline(timeout, attach) == attach + agent + pyspy.outside_budget(timeout)


@pytest.fixture
def py_spy_that_never_finishes() -> Iterator[int]:
    """A program standing for a py-spy that a loaded machine keeps from finishing, handed over
    as the native front end hands its py-spy over (outside/spawn.py), under a `main`'s scope."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    child = os.posix_spawn(
        "/bin/sleep",
        ["sleep", "60"],
        os.environ,
        file_actions=[(os.POSIX_SPAWN_DUP2, out_write, 1), (os.POSIX_SPAWN_DUP2, err_write, 2)],
    )
    os.close(out_write)
    os.close(err_write)
    # The process read from outside: this one, which py-spy could read at once.
    os.environ[spawn.HANDED_OVER] = f"{os.getpid()}:{child}:{out_read}:{err_read}"
    try:
        with spawn.HandOverScope():
            yield child
    finally:
        try:
            os.kill(child, 9)
            os.waitpid(child, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def test_a_read_out_of_time_ends_at_its_deadline_and_names_it_and_the_timeout_to_raise(
    py_spy_that_never_finishes: int,
) -> None:
    """One deadline for the whole read: a py-spy past it is not tried again (that doubled the
    wait and still said the first limit), and the error says which time ran out and how to give
    more."""
    started = time.monotonic()
    with pytest.raises(pyspy.OutsideTimeout) as raised:
        pyspy.dump(os.getpid(), timeout=0.5)  # below the floor: the read gets the floor
    took = time.monotonic() - started
    assert pyspy.OUTSIDE_FLOOR_S <= took < pyspy.OUTSIDE_FLOOR_S + 1.5
    assert raised.value.message == (
        f"py-spy did not read the stacks of PID {os.getpid()} within 3 s, the time a read from outside "
        "gets (--timeout, at least 3 s)"
    )
    assert raised.value.hint == (
        "raise --timeout, e.g. --timeout 12: py-spy is slower on a loaded machine, and --native slower still"
    )
    assert raised.value.exit_code == 1
