"""Large eval output arrives whole, or cut with a marker that says how much was dropped; it
never fails the command (issue 11, item 6). Under the venv's Python and 3.8."""

from __future__ import annotations

import subprocess
from typing import Iterator

import pytest

from probing.errors import ExitCode

from support import INTERPRETER_PATTERNS, PROBING, Target, find_interpreter, probing

PYTHON_38 = find_interpreter(INTERPRETER_PATTERNS["3.8"])
PYTHONS = [
    pytest.param(None, id="venv"),
    pytest.param(PYTHON_38, id="3.8", marks=[] if PYTHON_38 else [pytest.mark.skip(reason="no python 3.8")]),
]


@pytest.fixture(scope="module", params=PYTHONS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    kwargs = {"python": request.param} if request.param else {}
    with Target("sleeper.py", **kwargs) as started:
        yield started


def test_a_megabyte_of_printed_output_arrives_whole(target: Target) -> None:
    result = probing(str(target.pid), "eval", "print('x' * 1_100_000)")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "x" * 1_100_000 + "\n"


def test_non_ascii_output_arrives_whole(target: Target) -> None:
    result = probing(str(target.pid), "eval", "print('é' * 300_000)")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "é" * 300_000 + "\n"


def test_a_50_mb_value_is_cut_with_a_marker(target: Target) -> None:
    result = probing(str(target.pid), "eval", "'x' * 50_000_000", timeout=120)
    assert result.returncode == 0, result.stderr
    kept = 4 << 20
    assert result.stdout.startswith("'" + "x" * (kept - 1))
    dropped = 50_000_002 - kept
    assert result.stdout.endswith(
        f"\n[probing: {dropped} more characters of the value's repr were dropped]\n"
    )
    assert probing(str(target.pid), "eval", "1 + 1").stdout == "2\n"
    assert target.alive()


def test_output_past_the_capture_cap_is_cut_with_a_marker(target: Target) -> None:
    result = probing(str(target.pid), "eval", "print('y' * 5_000_000)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("y" * (4 << 20))
    assert "more characters of output were dropped]" in result.stdout


def test_a_large_error_keeps_its_output_and_traceback(target: Target) -> None:
    code = "print('o' * 1_200_000)\nraise ValueError('v' * 2_000_000)"
    result = probing(str(target.pid), "eval", code)
    assert result.returncode == ExitCode.REMOTE_ERROR
    assert result.stdout == "o" * 1_200_000 + "\n"
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    assert result.stderr.rstrip("\n").endswith("ValueError: " + "v" * 2_000_000)


def test_a_timed_out_eval_keeps_its_large_output(target: Target) -> None:
    code = "print('t' * 1_100_000)\nwhile True: pass"
    result = probing(str(target.pid), "eval", "--timeout", "0.5", code)
    assert result.returncode == ExitCode.AGENT_TIMEOUT
    assert result.stdout == "t" * 1_100_000 + "\n"
    assert "it was interrupted" in result.stderr


def test_the_repl_streams_a_megabyte_printed_at_once() -> None:
    with Target("stepper.py") as stepper:
        client = subprocess.run(
            [PROBING, str(stepper.pid), "repl"], input="print('r' * 1_100_000)\nprint('after')\n",
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert client.returncode == 0, client.stderr[-2000:]
        assert client.stdout == "r" * 1_100_000 + "\nafter\n"
        assert stepper.alive()
