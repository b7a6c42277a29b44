"""A rank at a glance (analysis/glance.py): its main thread's state and where, from the rows of
one look at its stacks; no process."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from probing.analysis.glance import glance

DIST = "/venv/lib/python3.11/site-packages/torch/distributed"
LIB = "/usr/lib/python3.11"
JOB = "/job/train.py"


def thread(
    *stack: Tuple[str, str, int], native_id: int = 7, name: str = "MainThread", main: bool = True
) -> List[Dict[str, Any]]:
    """python.backtrace rows of one thread, innermost frame first."""
    return [
        {"pid": 7, "thread_id": native_id, "native_id": native_id, "thread_name": name, "is_main": main,
         "depth": depth, "func": func, "file": file, "lineno": line, "frame_type": "Python"}
        for depth, (func, file, line) in enumerate(stack)
    ]  # fmt: skip


def look(rows: List[Dict[str, Any]], lines: Optional[Dict[int, str]] = None, **outside: Any) -> str:
    """glance with source lines by line number and py-spy's view of threads by native id."""
    views = {int(native_id[1:]): view for native_id, view in outside.items()}
    return glance(rows, lambda frame: (lines or {}).get(frame["lineno"], ""), views)


IN_ALL_REDUCE = thread(
    ("all_reduce", f"{DIST}/distributed_c10d.py", 3252),
    ("wrapper", f"{DIST}/c10d_logger.py", 83),
    ("train", JOB, 64),
    ("<module>", JOB, 71),
)


def test_a_rank_in_a_collective_is_named_after_the_collective_and_where_the_job_called_it() -> None:
    assert look(IN_ALL_REDUCE) == "in torch.distributed.all_reduce from train (train.py:64)"


def test_a_rank_stalled_in_its_own_code_says_what_it_does_there() -> None:
    stalled = thread(("load_shard", JOB, 38), ("train", JOB, 58), ("<module>", JOB, 71))
    assert look(stalled, {38: "time.sleep(3600)"}) == "sleeping in load_shard (train.py:38)"


def test_a_rank_holding_the_gil_says_so() -> None:
    holding = thread(("hold_the_gil", JOB, 44), ("train", JOB, 60))
    state = look(holding, {44: "ctypes.PyDLL(None).sleep(3600)"}, t7={"owns_gil": True})
    assert state == "holds the GIL, sleeping in hold_the_gil (train.py:44)"


def test_the_gil_held_in_a_collective_is_not_hidden_by_its_name() -> None:
    assert look(IN_ALL_REDUCE, t7={"owns_gil": True}).startswith("holds the GIL")


def test_a_running_rank_is_running_where_it_was_seen() -> None:
    assert look(thread(("forward", JOB, 12), ("train", JOB, 60))) == "running in forward (train.py:12)"


IN_BACKWARD = thread(
    ("_engine_run_backward", "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", 979),
    ("backward", "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", 395),
    ("backward", "/venv/lib/python3.11/site-packages/torch/_tensor.py", 623),
    ("train", JOB, 57),
)


def test_a_thread_asleep_in_a_c_call_of_torch_waits_there_seen_from_outside() -> None:
    """DDP's backward waits for its gradients' all_reduce inside a C call: py-spy sees it idle."""
    state = look(IN_BACKWARD, t7={"owns_gil": False, "active": False})
    assert state == "waiting in a C call in _engine_run_backward from train (train.py:57)"


def test_the_agent_cannot_tell_a_c_call_that_waits_from_one_that_runs() -> None:
    assert look(IN_BACKWARD) == "running in _engine_run_backward from train (train.py:57)"
    assert (
        look(IN_BACKWARD, t7={"active": True}) == "running in _engine_run_backward from train (train.py:57)"
    )


def test_where_is_the_jobs_own_code_not_the_standard_librarys() -> None:
    decoding = thread(("raw_decode", f"{LIB}/json/decoder.py", 353), ("load_config", JOB, 5))
    assert look(decoding) == "running in raw_decode from load_config (train.py:5)"


def test_a_thread_with_no_frame_of_the_job_says_where_it_is_without_it() -> None:
    assert look(thread(("run", f"{LIB}/threading.py", 982), main=False)) == "running in run"


def test_a_library_wait_is_named_from_the_job_line_that_called_it() -> None:
    waiting = thread(
        ("wait", f"{LIB}/threading.py", 327), ("get", f"{LIB}/queue.py", 171), ("train", JOB, 20)
    )
    assert look(waiting) == "waiting on a queue (Queue.get) from train (train.py:20)"


def test_only_the_main_thread_is_read_and_another_holding_the_gil_is_named() -> None:
    rows = [
        *thread(("spin", JOB, 4), native_id=9, name="spinner", main=False),
        *thread(
            ("wait", f"{LIB}/threading.py", 327), ("join", f"{LIB}/threading.py", 1119), ("main", JOB, 30)
        ),
    ]
    state = look(rows, t9={"owns_gil": True}, t7={"owns_gil": False})
    assert state == "waiting in Thread.join from main (train.py:30); thread 'spinner' holds the GIL"


def test_without_a_thread_marked_main_the_first_listed_is_read() -> None:
    rows = thread(("serve", JOB, 9), native_id=11, name="server", main=False)
    assert look(rows, {9: "conn = sock.accept()"}) == "waiting on socket I/O in serve (train.py:9)"


def test_no_threads() -> None:
    assert look([]) == "no Python threads"
