"""`probing PID backtrace` against real targets, under every CPython on the machine."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List

import pytest

from probing.errors import ExitCode

from support import TARGETS, Target, interpreter_params, probing


@pytest.fixture(scope="module", params=interpreter_params())
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    with Target("sleeper.py", python=request.param) as started:
        yield started


def rows(target: Target, *args: str) -> List[Dict[str, Any]]:
    result = probing(str(target.pid), "backtrace", "--format", "json", *args)
    assert result.returncode == 0, result.stderr
    found: List[Dict[str, Any]] = json.loads(result.stdout)
    return found


def test_every_python_thread_main_first_agent_threads_left_out(target: Target) -> None:
    found = rows(target)
    names = list(dict.fromkeys(row["thread_name"] for row in found))
    assert names == ["MainThread", "worker"]
    innermost = {row["thread_name"]: row["func"] for row in found if row["depth"] == 0}
    assert innermost == {"MainThread": "main_loop", "worker": "wait"}
    assert all(row["source"] == "agent" and row["frame_type"] == "Python" for row in found)
    assert all(row["pid"] == target.pid for row in found)
    assert {row["is_main"] for row in found if row["thread_name"] == "MainThread"} == {True}


def test_line_numbers_are_those_of_traceback_extract_stack(target: Target) -> None:
    expected = probing(
        str(target.pid), "eval",
        "import sys, threading, traceback\n"
        "frame = sys._current_frames()[threading.main_thread().ident]\n"
        "print([[f.filename, f.name, f.lineno] for f in traceback.extract_stack(frame)])",
    )  # fmt: skip
    assert expected.returncode == 0, expected.stderr
    main = sorted((r for r in rows(target) if r["is_main"]), key=lambda r: -r["depth"])
    assert [[r["file"], r["func"], r["lineno"]] for r in main] == json.loads(
        expected.stdout.replace("'", '"')
    )


def test_text_reads_like_a_traceback(target: Target) -> None:
    result = probing(str(target.pid), "backtrace")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"Process {target.pid} (Python ")
    assert (
        lines[2]
        == f'Thread {target.pid} "MainThread", main thread: reading standard input (most recent call last):'
    )
    call_line = (TARGETS / "sleeper.py").read_text().splitlines().index("main_loop()") + 1
    assert lines[3].endswith(f'sleeper.py", line {call_line}, in <module>')
    assert lines[4] == "    main_loop()"
    assert "    for _ in sys.stdin:" in lines
    assert any(line.startswith("Thread ") and '"worker"' in line for line in lines)


@pytest.mark.parametrize("selector", ["worker", "ident", "native"])
def test_thread_filter_by_name_ident_or_native_id(target: Target, selector: str) -> None:
    worker = next(row for row in rows(target) if row["thread_name"] == "worker")
    value = {
        "worker": "worker",
        "ident": str(worker["thread_id"]),
        "native": str(worker["native_id"]),
    }
    only = rows(target, "--thread", value[selector])
    assert {row["thread_name"] for row in only} == {"worker"}


def test_unknown_thread_is_a_clear_error(target: Target) -> None:
    result = probing(str(target.pid), "backtrace", "--thread", "nope")
    assert result.returncode == ExitCode.ERROR
    assert "no thread named or numbered 'nope'; threads: MainThread" in result.stderr
    assert "Traceback" not in result.stderr


def test_locals_are_bounded_and_never_raise(target: Target) -> None:
    main = [row for row in rows(target, "--locals", "--thread", "MainThread") if row["func"] == "main_loop"]
    local_values = main[0]["locals"]  # a JSON column: an object in --format json
    assert local_values["number"] == "42"
    assert local_values["big"].startswith("'xxxx") and len(local_values["big"]) <= 200
    assert local_values["broken"] == "<BrokenRepr object; repr failed: RuntimeError>"
    assert local_values["nested"].startswith("{'a': [1, 2, {'b': [0, 1, 2, 3, 4, 5, 6, 7, ...]}]}")
    assert all(row["locals"] is None for row in rows(target))


def test_csv_and_jsonl_rows(target: Target) -> None:
    csv_lines = probing(str(target.pid), "backtrace", "--format", "csv").stdout.splitlines()
    assert (
        csv_lines[0]
        == "pid,thread_id,native_id,thread_name,is_main,depth,func,file,lineno,frame_type,locals,source"
    )
    jsonl = probing(str(target.pid), "backtrace", "--format", "jsonl").stdout.splitlines()
    assert len(jsonl) == len(csv_lines) - 1
    assert json.loads(jsonl[0])["thread_name"] == "MainThread"


def test_tensors_show_metadata_never_values() -> None:
    pytest.importorskip("torch")
    with Target("trainer.py") as trainer:
        found = rows(trainer, "--locals", "--thread", "MainThread")
        train = next(row for row in found if row["func"] == "train")["locals"]
        assert train["data"] == "Tensor(shape=[32, 8], dtype=torch.float32, device=cpu, requires_grad=False)"
        assert train["loss"] == "Tensor(shape=[], dtype=torch.float32, device=cpu, requires_grad=True)"
        module = next(row for row in found if row["func"] == "<module>")["locals"]
        assert "Sequential(" in module["model"] and "torch" not in module
