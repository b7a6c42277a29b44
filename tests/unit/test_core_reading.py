"""What the core reader prints -> python.backtrace rows and errors (outside/core.py), on a
reading captured once from a real core (tests/unit/data/pystack_core_segfault.json:
tests/targets/segfaults.py crashed under `ulimit -c unlimited` on CPython 3.11, read by
outside/core_reader.py with --locals, paths renamed), and on hostile or broken readings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

from probing.cli.core import _sql
from probing.cli.render.core import how_it_ended
from probing.engine.core import only_thread, query_core
from probing.errors import BadRecord, BadSQL, NotLive, ProbingError, UsageError
from probing.outside.core import CoreReading, parse_reading, reading_from_document
from probing.schema.tables import BACKTRACE

DATA = Path(__file__).resolve().parent / "data"


def captured() -> Dict[str, Any]:
    document: Dict[str, Any] = json.loads((DATA / "pystack_core_segfault.json").read_text())
    return document


def reading_of(document: Dict[str, Any]) -> CoreReading:
    return parse_reading("core.1", 0, json.dumps(document).encode(), b"")


def test_rows_have_every_backtrace_column_main_thread_first() -> None:
    reading = reading_of(captured())
    rows = reading.rows
    assert all(list(row) == BACKTRACE.column_names() for row in rows)
    assert rows[0]["is_main"] and rows[0]["thread_name"] == "MainThread"
    main = [row for row in rows if row["is_main"]]
    assert [row["func"] for row in main] == ["string_at", "read_null", "train", "<module>"]
    assert [row["depth"] for row in main] == [0, 1, 2, 3]
    assert main[1]["file"] == "/home/user/project/segfaults.py" and main[1]["lineno"] == 12
    assert json.loads(main[1]["locals"]) == {"step": "3"}
    assert {row["source"] for row in rows} == {"pystack"}
    assert {row["frame_type"] for row in rows} == {"Python"}
    assert all(row["thread_id"] is None for row in rows)  # no Python ident in a core
    helper = [row for row in rows if not row["is_main"]]
    assert helper[0]["thread_name"] == f"Thread-{helper[0]['native_id']}"
    assert helper[0]["func"] == "wait" and helper[2]["func"] == "wait_for_stop"


def test_the_process_and_its_end_are_read_from_the_core() -> None:
    reading = reading_of(captured())
    assert reading.pid == 20354 and reading.gil == 20354
    assert reading.python_version == "3.11"
    assert reading.arguments == "/home/user/venv/bin/python /home/user/project/segfaults.py"
    assert how_it_ended(reading) == "ended by SIGSEGV at address 0x0"
    reading.signal = 19
    assert "gcore" in how_it_ended(reading)
    reading.signal = None
    assert how_it_ended(reading) == "no signal recorded"


def test_a_thread_named_by_the_job_keeps_its_name() -> None:
    document = captured()
    threads = document["reading"]["threads"]
    threads[0]["name"] = "pt_autograd_0"
    assert reading_of(document).rows[-1]["thread_name"] == "pt_autograd_0"
    threads[0]["name"] = "python"  # the process's own name, inherited: says nothing
    assert reading_of(document).rows[-1]["thread_name"].startswith("Thread-")


def test_fields_of_the_wrong_type_are_dropped_and_long_ones_cut() -> None:
    hostile = {
        "pid": "20354",
        "signal": True,
        "arguments": "x" * 100_000,
        "threads": [
            "not a thread",
            {
                "tid": 5,
                "frames": [{"func": ["f"], "file": None, "lineno": "12", "locals": {"a": "y" * 10_000}}, 7],
            },
            {"tid": None, "frames": "none"},
        ],
    }
    reading = reading_from_document("core.1", hostile)
    assert reading.pid is None and reading.signal is None
    assert len(reading.arguments) <= 4000
    (row,) = reading.rows
    assert row["native_id"] == 5 and row["lineno"] is None and row["func"] == "['f']"
    assert len(json.loads(row["locals"])["a"]) <= 4000


@pytest.mark.parametrize(
    ("kind", "error", "words"),
    [
        ("not_core", BadRecord, "is not a core file pystack can read"),
        ("not_python", BadRecord, "is not the core of a Python process"),
        ("no_executable", BadRecord, "which is not on this machine"),
        ("wrong_executable", BadRecord, "--exe does not match the core"),
        ("unreadable", BadRecord, "could not read the Python stacks"),
        ("no_pystack", ProbingError, "pystack is needed"),
    ],
)
def test_each_failure_the_reader_names_is_a_clear_error(kind: str, error: type, words: str) -> None:
    said = {"failure": kind, "message": "which is not on this machine"}
    with pytest.raises(error) as raised:
        parse_reading("core.1", 3, json.dumps(said).encode(), b"")
    assert words in raised.value.message
    assert raised.value.exit_code == (15 if error is BadRecord else 1)
    if kind == "no_executable":
        assert "--exe" in (raised.value.hint or "")


@pytest.mark.parametrize(
    ("status", "stdout", "stderr", "words"),
    [
        (-11, b"", b"", "killed by signal 11"),
        (1, b"{not json", b"Traceback ...\nMemoryError\n", "MemoryError"),
        (0, b"[1, 2]", b"", "printed nothing usable"),
        (0, b'{"reading": []}', b"", "printed nothing usable"),
    ],
)
def test_a_reader_that_fails_without_saying_why_is_a_bad_record(
    status: int, stdout: bytes, stderr: bytes, words: str
) -> None:
    with pytest.raises(BadRecord) as raised:
        parse_reading("core.1", status, stdout, stderr)
    assert words in raised.value.message


def test_sql_runs_over_the_rows_and_other_tables_need_a_live_process() -> None:
    reading = reading_of(captured())
    result = query_core(
        reading, "SELECT func, file, lineno FROM python.backtrace WHERE depth = 0 ORDER BY func"
    )
    assert result.columns == ["func", "file", "lineno"]
    assert [row[0] for row in result.rows] == ["string_at", "wait"]
    with pytest.raises(NotLive, match="python.torch_trace needs a live process"):
        query_core(reading, "SELECT * FROM python.torch_trace")
    with pytest.raises(BadSQL):
        query_core(reading, "SELECT nonsense FROM backtrace")


def test_one_thread_by_name_or_native_id() -> None:
    rows = reading_of(captured()).rows
    assert {row["thread_name"] for row in only_thread(rows, "MainThread")} == {"MainThread"}
    assert {row["native_id"] for row in only_thread(rows, "20355")} == {20355}
    with pytest.raises(ProbingError, match="threads: MainThread"):
        only_thread(rows, "nope")


def test_the_command_words_after_the_core() -> None:
    assert _sql(()) is None and _sql(("backtrace",)) is None
    assert _sql(("query", "SELECT 1")) == "SELECT 1"
    for words in (("query",), ("query", "a", "b"), ("stacks",)):
        with pytest.raises(UsageError):
            _sql(words)
