"""Code that binds new names runs in __main__ as it did before frame names (review-b finding 5):
a `global` in a function the eval defines reaches __main__."""

from __future__ import annotations

from typing import Iterator

import pytest

from support import Target, interpreter_params, probing


@pytest.fixture(scope="module", params=interpreter_params())
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    with Target("frame_names.py", python=request.param) as started:
        yield started


def test_a_global_set_by_a_function_the_eval_defines_is_in_main_for_the_next_eval(target: Target) -> None:
    bump = "def bump():\n    global bumped\n    bumped = 7\nbump()\nprint(bumped)"
    first = probing(str(target.pid), "eval", bump)
    assert (first.returncode, first.stdout, first.stderr) == (0, "7\n", "")
    second = probing(str(target.pid), "eval", "print(bumped)")
    assert (second.returncode, second.stdout) == (0, "7\n"), second.stderr


def test_new_names_and_imports_go_to_main(target: Target) -> None:
    first = probing(str(target.pid), "eval", "import json as json_module\nfresh = 1\nprint(fresh)")
    assert (first.returncode, first.stdout, first.stderr) == (0, "1\n", "")
    second = probing(str(target.pid), "eval", "fresh + len(json_module.dumps(fresh))")
    assert (second.returncode, second.stdout) == (0, "2\n"), second.stderr


def test_a_name_error_shows_the_users_line_and_none_of_probings_frames(target: Target) -> None:
    result = probing(str(target.pid), "eval", "x = 1\nprint(zzz_nothing_like_it)")
    assert result.returncode != 0
    assert "line 2, in <module>" in result.stderr
    assert "probing/agent" not in result.stderr, result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == "NameError: name 'zzz_nothing_like_it' is not defined"


def test_a_global_set_by_a_function_of_an_eval_that_reads_a_frame_name_is_in_main(target: Target) -> None:
    bump = "def bump():\n    global bumped_from_loss\n    bumped_from_loss = loss * 2\nbump()"
    first = probing(str(target.pid), "eval", bump)
    assert first.returncode == 0, first.stderr
    second = probing(str(target.pid), "eval", "print(bumped_from_loss)")
    assert (second.returncode, second.stdout) == (0, "5.0\n"), second.stderr
