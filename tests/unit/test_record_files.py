"""Reading what a dead job left: faulthandler's text as python.backtrace rows, and a record file
(written with protocol.records.write_record) as the rows and `info` the commands use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from probing.engine.fatal_text import FAULTING_THREAD, parse_faulthandler
from probing.engine.records.path import is_record_path
from probing.engine.records.record import open_record, read_any
from probing.engine.records.stacks import record_stacks
from probing.errors import BadRecord, ProbingError
from probing.protocol.records import write_record
from probing.protocol.tables import ColumnBuffers, encode_table

FAULTHANDLER_TEXT = """Fatal Python error: Segmentation fault

Thread 0x00007f0338e756c0 (most recent call first):
  File "/job/data.py", line 5 in idle
  File "/usr/lib/python3.11/threading.py", line 870 in run
  File "/usr/lib/python3.11/threading.py", line 890 in _bootstrap

Current thread 0x00007f0339650b80 (most recent call first):
  File "/usr/lib/python3.11/ctypes/__init__.py", line 514 in string_at
  File "/job/train.py", line 8 in crash
  File "/job/train.py", line 9 in <module>

Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)
"""


def test_faulthandler_text_becomes_rows_with_the_faulting_thread_first_and_marked() -> None:
    message, rows = parse_faulthandler(FAULTHANDLER_TEXT, 42)
    assert message == "Segmentation fault"
    faulting = [row for row in rows if row["thread_name"] == FAULTING_THREAD]
    assert [row["func"] for row in faulting] == ["string_at", "crash", "<module>"]
    assert [row["depth"] for row in faulting] == [0, 1, 2]
    assert rows[0]["thread_name"] == FAULTING_THREAD and rows[0]["thread_id"] == 0x00007F0339650B80
    assert all(row["is_main"] for row in faulting)  # its outermost frame is the module's top level
    other = [row for row in rows if row["thread_name"] != FAULTING_THREAD]
    assert [row["lineno"] for row in other] == [5, 870, 890] and not any(row["is_main"] for row in other)
    assert {row["pid"] for row in rows} == {42} and {row["source"] for row in rows} == {"faulthandler"}


def test_faulthandler_text_of_one_thread_and_unknown_lines() -> None:
    text = (
        "Fatal Python error: Aborted\n\nStack (most recent call first):\n"
        '  File "a.py", line ??? in f\n  <no Python frame>\ngarbage\n  File "x.py", line 1 in g\n'
    )
    message, rows = parse_faulthandler(text, None)
    assert message == "Aborted"
    assert [(row["func"], row["lineno"], row["thread_name"]) for row in rows] == [
        ("f", None, FAULTING_THREAD)
    ]


def test_the_agents_own_threads_are_left_out_of_faulthandlers_text() -> None:
    agent = (
        "Thread 0x00000000000000aa (most recent call first):\n"
        '  File "/usr/lib/python3.11/selectors.py", line 415 in select\n'
        '  File "/venv/lib/python3.11/site-packages/probing/agent/server.py", line 90 in serve\n'
        '  File "/usr/lib/python3.11/threading.py", line 982 in run\n'
        '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
    )
    _, rows = parse_faulthandler(agent + FAULTHANDLER_TEXT, 1)
    assert 0xAA not in {row["thread_id"] for row in rows}
    assert len({row["thread_id"] for row in rows}) == 2


def test_faulthandler_text_with_nothing_in_it() -> None:
    assert parse_faulthandler("", 1) == (None, [])


def _record(tmp_path: Path, header: dict, tables: list) -> str:  # type: ignore[type-arg]
    return write_record(str(tmp_path), "job-1-20261123-000000.probing", header, tables)


def _backtrace_table() -> tuple:  # type: ignore[type-arg]
    import array

    def ints(values: list) -> bytes:  # type: ignore[type-arg]
        return array.array("q", values).tobytes()

    def words(count: int) -> bytes:
        return array.array("i", range(count)).tobytes()

    columns = [
        ColumnBuffers("pid", "BIGINT", ints([7, 7]), None, None),
        ColumnBuffers("thread_id", "BIGINT", ints([1, 1]), None, None),
        ColumnBuffers("thread_name", "VARCHAR", array.array("i", [0, 0]).tobytes(), None, ["MainThread"]),
        ColumnBuffers("depth", "BIGINT", ints([0, 1]), None, None),
        ColumnBuffers("func", "VARCHAR", words(2), None, ["inner", "<module>"]),
        ColumnBuffers("file", "VARCHAR", array.array("i", [0, 0]).tobytes(), None, ["train.py"]),
        ColumnBuffers("lineno", "BIGINT", ints([3, 9]), None, None),
        ColumnBuffers("locals", "JSON", array.array("i", [0, -1]).tobytes(), None, ['{"x": "1"}']),
    ]
    descriptor, chunks = encode_table("python.backtrace", 2, columns)
    return descriptor, chunks


HEADER = {
    "pid": 7, "argv": ["train.py", "--steps", "9"], "python_version": "3.11.7", "written_at": 1.0,
    "reason": {"kind": "exception", "message": "ValueError: boom", "signal": None, "exit_status": None},
    "exception": {"type": "ValueError", "message": "boom", "text": "Traceback...\nValueError: boom\n",
                  "thread": "MainThread", "frames": []},
    "rank": {"rank": 3, "local_rank": 1, "world_size": 8, "node": 1, "run_id": "x"},
}  # fmt: skip


def test_a_record_maps_to_the_info_and_rows_of_a_live_process(tmp_path: Path) -> None:
    path = _record(tmp_path, HEADER, [_backtrace_table()])
    record = open_record(path)
    assert record.info() == {"pid": 7, "python_version": "3.11.7", "argv": ["train.py", "--steps", "9"]}
    assert record.reason()["kind"] == "exception" and record.exception()["type"] == "ValueError"  # type: ignore[index]
    assert record.rank() == {"rank": 3, "local_rank": 1, "world_size": 8, "node": 1}
    rows = record_stacks(record, locals=False, thread=None).rows
    assert [(row["func"], row["depth"], row["locals"]) for row in rows] == [
        ("inner", 0, None),
        ("<module>", 1, None),
    ]
    # Columns the file left out are there, empty: the renderers read every one.
    assert rows[0]["native_id"] is None and rows[0]["frame_type"] is None
    assert record_stacks(record, locals=True, thread="MainThread").rows[0]["locals"] == '{"x": "1"}'
    with pytest.raises(ProbingError, match="no thread named"):
        record_stacks(record, locals=False, thread="nope")


def test_header_fields_of_the_wrong_type_are_left_out(tmp_path: Path) -> None:
    header = {
        "pid": "7",
        "argv": "train.py",
        "python_version": 3,
        "reason": "boom",
        "exception": [],
        "rank": 5,
    }
    record = open_record(_record(tmp_path, header, []))
    assert record.info() == {"pid": None, "python_version": None, "argv": []}
    assert record.reason() == {"kind": None, "message": "", "signal": None, "exit_status": None}
    assert record.exception() is None and record.rank() is None


def test_a_table_name_that_is_no_table_name_is_left_out(tmp_path: Path) -> None:
    descriptor, chunks = _backtrace_table()
    record = open_record(_record(tmp_path, {}, [(dict(descriptor, name="../../etc/x"), chunks)]))
    assert record.tables == [] and "left out" in record.notes[0]


def test_a_fatal_file_without_a_trace_is_a_bad_record_when_used_as_a_target(tmp_path: Path) -> None:
    path = tmp_path / "job-9.fatal"
    path.write_text('#probing-fatal 1 {"pid": 9, "argv": ["job.py"]}\n')
    assert read_any(str(path)).backtrace_rows == []
    with pytest.raises(BadRecord, match="holds no trace"):
        open_record(str(path))
    path.write_text('#probing-fatal 1 {"pid": 9}\n' + FAULTHANDLER_TEXT)
    record = open_record(str(path))
    assert record.reason()["kind"] == "fatal_signal" and record.reason()["signal"] == 11
    assert record.table_names() == ["python.backtrace"]


def test_what_is_taken_for_a_record_path(tmp_path: Path) -> None:
    (tmp_path / "a.probing").write_bytes(b"")
    (tmp_path / "b.txt").write_bytes(b"PRBREC\x00\x07rest")
    (tmp_path / "c.txt").write_bytes(b"hello")
    os.mkfifo(tmp_path / "d.probing")
    assert is_record_path(str(tmp_path / "a.probing")) and is_record_path(str(tmp_path / "b.txt"))
    assert not is_record_path(str(tmp_path / "c.txt")) and not is_record_path(str(tmp_path / "d.probing"))
    assert not is_record_path("1234") and not is_record_path(str(tmp_path / "missing.probing"))


def test_hang_on_a_record_claims_a_verdict_only_when_the_record_was_one(tmp_path: Path) -> None:
    from probing.engine.records.reports import record_hang

    table = _backtrace_table()
    plain = open_record(write_record(str(tmp_path), "a.probing", HEADER, [table]))
    report = record_hang(plain, lambda frame: "")
    assert report["hung"] is None and "one snapshot" in report["reason"]
    assert [thread["name"] for thread in report["threads"]] == ["MainThread"]
    watchdog = dict(HEADER, reason={"kind": "watchdog", "message": "no progress in 900 s"})
    stuck = record_hang(
        open_record(write_record(str(tmp_path), "b.probing", watchdog, [table])), lambda f: ""
    )
    assert stuck["hung"] is True and "watchdog" in stuck["reason"]
