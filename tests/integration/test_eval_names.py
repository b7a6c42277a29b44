"""Names eval and repl read from the job's frames, through the CLI, under every CPython.

tests/targets/frame_names.py: `loss` (a cell) and `batch` are locals of train() in the main
thread; the `loader` thread's load() has another `batch` and a `queue_depth`; one object is
`shared` in both. __main__ holds none of these.
"""

from __future__ import annotations

import re
import secrets
from typing import Iterator

import pytest

from probing.client.connection import Client
from probing.client.discovery import locate_socket
from probing.errors import ExitCode

from support import Target, interpreter_params, probing

WHERE_LOSS = re.compile(r"^probing: loss: local of train\(\) at frame_names\.py:\d+, MainThread$", re.M)


@pytest.fixture(scope="module", params=interpreter_params())
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    with Target("frame_names.py", python=request.param) as started:
        yield started


def evaluate(target: Target, code: str, *options: str) -> tuple[int, str, str]:
    result = probing(str(target.pid), "eval", *options, code)
    return result.returncode, result.stdout, result.stderr


def test_a_local_of_the_training_function_is_found_and_stderr_says_where(target: Target) -> None:
    code, out, err = evaluate(target, "print(f'Loss: {loss}')")
    assert (code, out) == (0, "Loss: 2.5\n"), err
    assert WHERE_LOSS.search(err), err


def test_a_name_only_another_thread_holds_is_found_there(target: Target) -> None:
    code, out, err = evaluate(target, "queue_depth * 6")
    assert (code, out) == (0, "42\n"), err
    assert re.search(r"^probing: queue_depth: local of load\(\) at frame_names\.py:\d+, loader$", err, re.M)


def test_frames_holding_the_same_object_are_one_answer(target: Target) -> None:
    code, out, err = evaluate(target, "shared")
    assert (code, out) == (0, "<the shared object>\n"), err
    assert "probing: shared: local of train() at frame_names.py:" in err
    assert "(the same object in 1 more frame)" in err


def test_different_values_stop_before_anything_runs_and_list_the_frame_spellings(target: Target) -> None:
    code, out, err = evaluate(target, "import sys\nsys.modules['__main__'].ran = True\nprint(batch)")
    assert code == ExitCode.REMOTE_ERROR and out == ""
    assert "NameError: name 'batch' is not in __main__, and 2 frames hold different values under it" in err
    assert re.search(
        r"batch: local of train\(\) at frame_names\.py:\d+, MainThread   --frame MainThread:train", err
    )
    assert re.search(r"batch: local of load\(\) at frame_names\.py:\d+, loader   --frame loader:load", err)
    assert evaluate(target, "import sys; hasattr(sys.modules['__main__'], 'ran')")[1] == "False\n"


def test_the_frame_spelling_from_the_error_picks_that_frame(target: Target) -> None:
    assert evaluate(target, "batch", "--frame", "loader:load")[:2] == (0, "'loader batch'\n")
    assert evaluate(target, "batch", "--frame", "MainThread:train")[:2] == (0, "'main batch'\n")


def test_frame_wins_and_looks_nowhere_else(target: Target) -> None:
    code, _, err = evaluate(target, "queue_depth", "--frame", "MainThread:train")
    assert code == ExitCode.REMOTE_ERROR and "NameError: name 'queue_depth' is not defined" in err
    assert "probing:" not in err


def test_an_assignment_never_reaches_the_frame_and_says_so(target: Target) -> None:
    code, out, err = evaluate(target, "loss = loss * 2\nloss")
    assert (code, out) == (0, "5.0\n"), err
    assert "probing: loss: assigned after it was read from a frame; the new value stays in this eval" in err
    # The frame's loss and __main__ are as they were.
    assert evaluate(target, "loss")[1] == "2.5\n"
    assert evaluate(target, "'loss' in globals()")[1] == "False\n"
    # Under --frame the code runs over a copy of the frame's locals: not written back either.
    assert evaluate(target, "loss = 99", "--frame", "MainThread:train")[0] == 0
    assert evaluate(target, "loss", "--frame", "MainThread:train")[1] == "2.5\n"


def test_a_name_no_frame_holds_reads_as_before_with_where_similar_names_live(target: Target) -> None:
    code, _, err = evaluate(target, "los + 1")
    assert code == ExitCode.REMOTE_ERROR
    assert re.search(
        r"NameError: name 'los' is not defined\. Did you mean: 'loss' \(local of train\(\) at", err
    )
    code, _, err = evaluate(target, "zzz_nothing_like_it")
    assert code == ExitCode.REMOTE_ERROR
    assert err.rstrip().splitlines()[-1] == "NameError: name 'zzz_nothing_like_it' is not defined"


def test_code_naming_only_main_globals_runs_as_it_always_did(target: Target) -> None:
    code, out, err = evaluate(target, "counter = counter + 1\ncounter")
    assert (code, out, err) == (0, "2\n", "")
    assert evaluate(target, "counter")[1] == "2\n"  # eval's assignments still land in __main__


def test_comprehensions_and_functions_in_the_code_see_frame_names(target: Target) -> None:
    code, out, err = evaluate(target, "def twice():\n    return loss * 2\n[twice() + i for i in range(2)]")
    assert (code, out) == (0, "[5.0, 6.0]\n"), err


def test_the_repl_reads_frame_names_and_its_own_assignments_hide_them(target: Target) -> None:
    session = "loss\nloss = 1\nloss\ndel loss\nloss + 1\nloss = loss * 2\nloss\n"
    result = probing(str(target.pid), "repl", input=session)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["2.5", "1", "3.5", "5.0"]
    assert WHERE_LOSS.search(result.stderr), result.stderr
    assert "probing: loss: the session's value now hides the local of train() at" in result.stderr
    read_then_assigned = (
        "probing: loss: assigned after it was read from a frame; the session's value now hides"
    )
    assert read_then_assigned in result.stderr
    assert evaluate(target, "loss")[1] == "2.5\n"


def test_the_repl_refuses_an_ambiguous_name_and_goes_on(target: Target) -> None:
    result = probing(str(target.pid), "repl", input="batch\nqueue_depth\n")
    assert "--frame MainThread:train" in result.stderr and "--frame loader:load" in result.stderr
    assert result.stdout == "7\n"
    assert result.returncode == ExitCode.REMOTE_ERROR  # piped: a statement raised


@pytest.fixture(scope="module")
def listening() -> Iterator[tuple[Target, str, dict[str, str]]]:
    token = {"PROBING_TOKEN": secrets.token_hex(16)}
    with Target("frame_names.py", via="env", env=dict(token, PROBING_LISTEN="127.0.0.1:0")) as started:
        with Client(locate_socket(started.pid), 10.0, pid=started.pid) as client:
            client.call("ping")
            listener = client.info["listener"]
        yield started, str(listener["endpoint"]), token


def test_host_port_is_a_target_without_tcp_scheme(listening: tuple[Target, str, dict[str, str]]) -> None:
    _, endpoint, token = listening
    assert re.fullmatch(r"127\.0\.0\.1:\d+", endpoint)
    result = probing(endpoint, "eval", "loss", env=token)
    assert (result.returncode, result.stdout) == (0, "2.5\n"), result.stderr
    assert WHERE_LOSS.search(result.stderr)
    assert probing("-t", endpoint, "eval", "counter", env=token).stdout == "1\n"


def test_host_port_without_a_port_number_is_still_a_usage_error() -> None:
    result = probing("somehost:notaport", "backtrace")
    assert result.returncode == ExitCode.USAGE
    expected = "TARGET must be a PID, the path of an agent socket, HOST:PORT, tcp://HOST:PORT, a record"
    assert expected in result.stderr
