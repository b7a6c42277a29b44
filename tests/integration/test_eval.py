"""`probing PID eval` against real targets, under every CPython on the machine."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from probing.errors import ExitCode

from support import Target, agent_threads, interpreter_params, probing, wait_until


@pytest.fixture(scope="module", params=interpreter_params())
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    with Target("sleeper.py", python=request.param) as started:
        yield started


def test_a_final_expression_is_shown_as_the_repl_would(target: Target) -> None:
    result = probing(str(target.pid), "eval", "x = [1, 2]\nx + [3]")
    assert (result.returncode, result.stdout, result.stderr) == (0, "[1, 2, 3]\n", "")
    assert probing(str(target.pid), "eval", "None").stdout == ""
    assert probing(str(target.pid), "eval", "'text'").stdout == "'text'\n"


def test_code_runs_in_the_live_main_namespace(target: Target) -> None:
    assert (
        probing(str(target.pid), "eval", "type(stop).__name__, stop.is_set()").stdout == "('Event', False)\n"
    )
    assert probing(str(target.pid), "eval", "probe_value = 41").returncode == 0
    assert probing(str(target.pid), "eval", "probe_value + 1").stdout == "42\n"
    # The job sees what eval defined: it is the same namespace, not a copy.
    check = "import sys; sys.modules['__main__'].__dict__['probe_value']"
    assert probing(str(target.pid), "eval", check).stdout == "41\n"


def test_what_the_code_prints_comes_back(target: Target) -> None:
    result = probing(str(target.pid), "eval", "import sys\nprint('to out')\nprint('to err', file=sys.stderr)")
    assert (result.returncode, result.stdout, result.stderr) == (0, "to out\n", "to err\n")


def test_code_from_stdin(target: Target) -> None:
    code = "total = 0\nfor i in range(4):\n    total += i\n    print(i)\ntotal\n"
    result = probing(str(target.pid), "eval", "-", input=code)
    assert result.stdout == "0\n1\n2\n3\n6\n"


@pytest.mark.parametrize(
    "frame, code, expected",
    [
        ("MainThread:main_loop", "number + 1", "43\n"),
        ("worker:worker_loop", "label", "'worker-1'\n"),
        (
            "main_loop",
            "sorted(k for k in locals() if k in ('big', 'number'))",
            "['big', 'number']\n",
        ),
    ],
)
def test_frame_evaluates_with_that_frames_locals(
    target: Target, frame: str, code: str, expected: str
) -> None:
    result = probing(str(target.pid), "eval", "--frame", frame, code)
    assert (result.returncode, result.stdout) == (0, expected), result.stderr


def test_a_frame_that_is_not_running_is_a_clear_error(target: Target) -> None:
    result = probing(str(target.pid), "eval", "--frame", "MainThread:train", "loss")
    assert result.returncode == ExitCode.ERROR
    assert "no frame of function 'train' is running (MainThread: <module> > main_loop)" in result.stderr


def test_an_exception_returns_the_remote_traceback(target: Target) -> None:
    result = probing(str(target.pid), "eval", "x = 1\nx / 0")
    assert result.returncode == ExitCode.REMOTE_ERROR
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    assert "line 2, in <module>\n    x / 0\n" in result.stderr
    assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "probing/agent" not in result.stderr


@pytest.mark.parametrize("code", ["1/0", "x = 1\nx / 0", "def f(a):\n    return a\n\nf(1) / 0"])
def test_the_error_markers_sit_under_the_expression_on_the_codes_last_line(target: Target, code: str) -> None:
    """3.11 and 3.12 underline the failing expression (`~^~`); on eval'd code's last line, which
    has no newline, they were one column to the right. Other versions print no markers."""
    result = probing(str(target.pid), "eval", code)
    assert result.returncode == ExitCode.REMOTE_ERROR
    lines = result.stderr.splitlines()
    shown = code.splitlines()[-1].strip()
    at = lines.index(f"    {shown}")
    markers = lines[at + 1]
    if set(markers.strip()) <= set("~^"):
        assert markers.index(markers.strip()) == 4, result.stderr
        assert len(markers.strip()) == len(shown), result.stderr


def test_an_exception_inside_the_jobs_own_code_shows_its_frames(target: Target) -> None:
    result = probing(str(target.pid), "eval", "ratio(1, 0)")
    assert result.returncode == ExitCode.REMOTE_ERROR
    assert 'sleeper.py", line' in result.stderr and "in ratio\n    return a / b" in result.stderr
    assert "ZeroDivisionError" in result.stderr


def test_output_printed_before_the_exception_still_comes_back(target: Target) -> None:
    result = probing(str(target.pid), "eval", "print('partial')\nraise KeyError('k')")
    assert result.returncode == ExitCode.REMOTE_ERROR
    assert result.stdout == "partial\n" and "KeyError: 'k'" in result.stderr


def test_a_syntax_error_is_reported_as_the_target_sees_it(target: Target) -> None:
    result = probing(str(target.pid), "eval", "def broken(:")
    assert result.returncode == ExitCode.REMOTE_ERROR
    assert "SyntaxError" in result.stderr


def test_exit_in_eval_does_not_end_the_job(target: Target) -> None:
    result = probing(str(target.pid), "eval", "raise SystemExit(3)")
    assert result.returncode == ExitCode.REMOTE_ERROR and "SystemExit: 3" in result.stderr
    assert target.alive()
    assert probing(str(target.pid), "eval", "1 + 1").stdout == "2\n"


def test_a_runaway_eval_is_interrupted_at_its_timeout(target: Target) -> None:
    started = time.monotonic()
    result = probing(str(target.pid), "eval", "--timeout", "1", "print('spinning')\nwhile True: pass")
    elapsed = time.monotonic() - started
    assert result.returncode == ExitCode.AGENT_TIMEOUT
    assert "eval did not finish within 1 s; it was interrupted" in result.stderr
    assert result.stdout == "spinning\n"
    assert elapsed < 5, elapsed
    # The loop is gone: no eval thread is left burning a core.
    assert wait_until(
        lambda: not [name for name in agent_threads(target.pid) if name.startswith("probing-eval")]
    )


def test_an_eval_blocked_in_c_is_reported_as_still_running(target: Target) -> None:
    result = probing(str(target.pid), "eval", "--timeout", "0.5", "import time; time.sleep(2)")
    assert result.returncode == ExitCode.AGENT_TIMEOUT
    assert "still running in thread probing-eval-" in result.stderr
    assert "interrupted when it returns to Python code" in result.stderr


def test_the_jobs_own_prints_still_reach_its_terminal() -> None:
    with Target("printer.py") as printer:
        before = len(printer.stdout_lines)
        result = probing(
            str(printer.pid),
            "eval",
            "import time\nfor i in range(20):\n    print('from-eval', i)\n    time.sleep(0.01)",
        )
        assert result.returncode == 0
        assert result.stdout.splitlines() == [f"from-eval {i}" for i in range(20)]
        assert printer.finish() == 0
        job_output = printer.stdout_lines[before:]
        assert not [line for line in job_output if "from-eval" in line]
        assert len([line for line in job_output if line.startswith("tick")]) > 10
