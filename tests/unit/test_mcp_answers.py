"""The MCP tools' pure parts: stacks folded across ranks, the answer made of a CLI call, TARGET
kept a value."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

pytest.importorskip("anyio", reason="the MCP SDK is not installed (pip install 'probing[mcp]')")

from probing.mcp.calls import CliAnswer  # noqa: E402
from probing.mcp.folding import SUMMARY_THREADS, backtrace_summary, fold_stacks  # noqa: E402
from probing.mcp.tools import answered, changes_the_job, target_arguments  # noqa: E402


def _frames(rank: Any, pid: int, thread: str, stack: List[str], is_main: bool = True) -> List[Dict[str, Any]]:
    """Rows of one thread, innermost first (depth 0), as `backtrace --format json` prints them."""
    return [
        {"rank": rank, "pid": pid, "thread_id": 7 if is_main else 8, "thread_name": thread,
         "is_main": is_main, "depth": depth, "func": func, "file": "train.py", "lineno": 10 + depth}
        for depth, func in enumerate(reversed(stack))
    ]  # fmt: skip


def test_identical_stacks_of_several_ranks_fold_into_one_with_their_ranks() -> None:
    rows = [
        *_frames(2, 102, "MainThread", ["main", "step", "all_reduce"]),
        *_frames(0, 100, "MainThread", ["main", "step", "all_reduce"]),
        *_frames(1, 101, "MainThread", ["main", "load"]),
        *_frames(0, 100, "pin_memory", ["loop"], is_main=False),
    ]
    threads = fold_stacks(rows)
    assert [(t["name"], t["ranks"], t["pids"]) for t in threads] == [
        ("MainThread", [0, 2], [100, 102]), ("MainThread", [1], [101]), ("pin_memory", [0], [100]),
    ]  # fmt: skip
    assert threads[0]["frames"] == ["main (train.py:12)", "step (train.py:11)", "all_reduce (train.py:10)"]
    assert backtrace_summary(threads).splitlines()[0] == "MainThread of ranks 0,2: all_reduce (train.py:10)"


def test_one_process_has_no_ranks_and_a_long_summary_is_cut() -> None:
    rows = [
        row for index in range(SUMMARY_THREADS + 3) for row in _frames(None, 5, f"t{index}", ["run"], False)
    ]
    for index, row in enumerate(rows):
        row["thread_id"] = index
    threads = fold_stacks(rows)
    assert len(threads) == SUMMARY_THREADS + 3 and all(t["ranks"] is None for t in threads)
    lines = backtrace_summary(threads).splitlines()
    assert len(lines) == SUMMARY_THREADS + 1 and lines[-1].startswith("... and 3 more stacks")
    assert backtrace_summary([]) == "no thread"


def test_a_verdict_is_an_answer_and_a_failure_is_an_error_in_the_clis_words() -> None:
    hung = answered(CliAnswer(["hang"], 11, '{"hung": true}', "", {"hung": True}), "hung")
    assert not hung["is_error"] and hung["text"].startswith("hung (exit 11: ")
    assert hung["structured"]["result"] == {"hung": True}
    failed = answered(CliAnswer(["backtrace"], 3, "", "probing: error: no process with PID 9\n", None), "")
    assert failed["is_error"] and failed["text"] == "error: no process with PID 9"
    assert (
        failed["structured"]["result"] is None
        and failed["structured"]["meaning"] == "no process with that PID"
    )


def test_a_target_is_always_a_value_and_status_changes_nothing() -> None:
    assert target_arguments("--help", ["backtrace"]) == ["--target=--help", "backtrace"]
    with pytest.raises(ValueError, match="target is empty"):
        target_arguments("  ", ["backtrace"])
    assert changes_the_job("eval", {}) and changes_the_job("trace", {"action": "on"})
    assert not changes_the_job("nan", {"action": "status"})
