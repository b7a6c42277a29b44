"""py-spy's JSON dump -> python.backtrace rows (outside/pyspy.py), on dumps captured once from
real targets (tests/unit/data/, `py-spy dump --json` on CPython 3.11):

- pyspy_gil_held*.json: tests/targets/gil_held_join.py, a thread holding the GIL asleep in C
  (with and without --native);
- pyspy_dataloader_*.json: tests/targets/dataloader_stuck.py, its main process and its two
  workers (one idle, one stuck in __getitem__ at index 5), with --locals for the workers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

from probing.analysis.progress import Sample, stuck_dataloader_worker, verdict
from probing.analysis.states import thread_state
from probing.engine.hang import take_sample
from probing.outside.pyspy import gil_holder, rows_from_dump

DATA = Path(__file__).resolve().parent / "data"


def dump(name: str) -> Tuple[int, List[Dict[str, Any]]]:
    threads = json.loads((DATA / f"pyspy_{name}.json").read_text())
    return int(threads[0]["pid"]), threads


def states(name: str) -> Dict[str, str]:
    pid, threads = dump(name)
    outside = {thread["os_thread_id"]: thread for thread in threads}
    by_thread: Dict[Any, List[Dict[str, Any]]] = {}
    for row in rows_from_dump(pid, threads):
        by_thread.setdefault(row["thread_name"], []).append(row)
    return {
        name: thread_state(rows, lambda frame: "", outside.get(rows[0]["native_id"]))
        for name, rows in by_thread.items()
    }


def test_rows_have_every_backtrace_column_main_thread_first() -> None:
    pid, threads = dump("gil_held")
    rows = rows_from_dump(pid, threads)
    assert rows[0]["is_main"] and rows[0]["thread_name"] == "MainThread" and rows[0]["native_id"] == pid
    assert {row["source"] for row in rows} == {"py-spy"}
    assert {row["frame_type"] for row in rows} == {"Python"}
    holder = [row for row in rows if row["thread_name"] == "gil-holder"]
    assert [row["depth"] for row in holder] == list(range(len(holder)))
    # py-spy's qualified names (Thread.run) become co_name, as the agent reports them.
    assert [row["func"] for row in holder] == ["hold_the_gil", "run", "_bootstrap_inner", "_bootstrap"]
    assert holder[0]["lineno"] == 21 and holder[0]["file"].endswith("gil_held_join.py")


def test_the_gil_holder_is_named_from_the_dump() -> None:
    _, threads = dump("gil_held")
    assert gil_holder(threads) == "thread 'gil-holder' holds the GIL in hold_the_gil (gil_held_join.py:21)"
    assert states("gil_held")["gil-holder"].startswith("holds the GIL")


def test_native_frames_come_with_the_library_and_say_what_c_is_doing() -> None:
    pid, threads = dump("gil_held_native")
    rows = rows_from_dump(pid, threads)
    native = [row for row in rows if row["frame_type"] == "Native"]
    assert native and all(row["lineno"] is None or isinstance(row["lineno"], int) for row in native)
    assert any(row["func"] == "clock_nanosleep" for row in native)
    seen = states("gil_held_native")
    assert seen["gil-holder"] == "holds the GIL, sleeping"
    assert seen["MainThread"] == "waiting on a lock (native)"


def test_a_sample_from_the_dump_carries_the_gil_holder_and_judges_hung() -> None:
    pid, threads = dump("gil_held")
    outside = {thread["os_thread_id"]: thread for thread in threads}
    holder = next(thread["os_thread_id"] for thread in threads if thread["owns_gil"])
    first = take_sample(pid, rows_from_dump(pid, threads), {"outside": outside})
    assert first.gil_holder == holder
    # The fixture's process is gone: its /proc counters read as unknown.
    later = Sample(first.taken + 3, first.rows, first.counters, first.gil_holder)
    report = verdict(pid, [first, later], lambda frame: "")
    assert report.hung and [t.name for t in report.threads if t.holds_gil] == ["gil-holder"]


def test_dataloader_processes_read_from_outside() -> None:
    assert states("dataloader_main")["MainThread"] == "waiting for a DataLoader worker"
    assert states("dataloader_idle_worker")["MainThread"] == (
        "DataLoader worker waiting for work (an index from its queue)"
    )
    assert states("dataloader_stuck_worker")["MainThread"] == "waiting on an Event"


def test_the_stuck_worker_and_its_index_come_from_the_locals_in_the_dump() -> None:
    idle_pid, idle = dump("dataloader_idle_worker")
    stuck_pid, stuck = dump("dataloader_stuck_worker")
    workers = {idle_pid: rows_from_dump(idle_pid, idle), stuck_pid: rows_from_dump(stuck_pid, stuck)}
    found = stuck_dataloader_worker(workers)
    assert found is not None and found["pid"] == stuck_pid and str(found["index"]) == "5"
    assert found["where"] == "__getitem__ (dataloader_stuck.py:15)"
