"""What the fuzz layer (tests/fuzz/) found in the decoders of bytes a job controls, each kept here as
a plain case: py-spy's dump and the core reader's document read into python.backtrace rows of the
schema's types (DuckDB loads them), and an agent's errors and tables refused in one short line.
The inputs that found them are kept in tests/fuzz/corpus/*/crash-*."""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest

from probing.client.replies import BadReply, decode_reply_table, error_from_reply
from probing.engine.core import query_core
from probing.outside.core import parse_reading
from probing.outside.pyspy import gil_holder, rows_from_dump
from probing.protocol.frames import FrameError
from probing.protocol.tables import decode_table
from probing.schema.tables import BACKTRACE
from probing.sql.session import SqlSession

PID = 4461


def frame(**fields: Any) -> Dict[str, Any]:
    base = {"name": "Event.wait", "filename": "/x/threading.py", "module": None,
            "short_filename": "threading.py", "line": 629, "locals": None}  # fmt: skip
    return dict(base, **fields)


def thread(**fields: Any) -> Dict[str, Any]:
    base = {"pid": PID, "thread_id": 1, "thread_name": "worker", "os_thread_id": 4470, "active": False,
            "owns_gil": False, "frames": [frame()]}  # fmt: skip
    return dict(base, **fields)


def loaded(rows: List[Dict[str, Any]]) -> List[Any]:
    """The rows as `probing PID query` loads them into DuckDB, read back."""
    session = SqlSession([BACKTRACE.describe()])
    names = BACKTRACE.column_names()
    session.load_rows(BACKTRACE, [tuple(row[name] for name in names) for row in rows])
    return session.run("SELECT thread_name, func, file, lineno, locals FROM python.backtrace").rows


def utf8_of_its_type(row: Dict[str, Any]) -> bool:
    """Each value of the row NULL or of its column's type: an int of 64 bits, a bool, UTF-8 text."""
    for column in BACKTRACE.columns:
        value = row[column.name]
        if value is None:
            continue
        if column.type == "BIGINT":
            fits = type(value) is int and -(2**63) <= value < 2**63
        elif column.type == "BOOLEAN":
            fits = type(value) is bool
        else:
            fits = isinstance(value, str) and value.encode("utf-8", "surrogatepass") == value.encode(
                "utf-8", "backslashreplace"
            )
        if not fits:
            return False
    return True


GOOD = thread(os_thread_id=4471, thread_id=2)
LOCALS = [{"repr": "1"}, {"name": ["x"], "repr": "1"}, "x", {"name": "step", "repr": 3}]
DUMPS = {
    "frames-a-number": [thread(frames=float("nan")), GOOD],
    "frames-text": [thread(frames="wait"), GOOD],
    "a-frame-that-is-no-object": [thread(frames=[5, frame()])],
    "locals-of-other-shapes": [thread(frames=[frame(locals=LOCALS)])],
    "thread-ids-of-two-types": [thread(), thread(os_thread_id="4471", thread_id=2)],
    "a-thread-id-a-list": [thread(os_thread_id=[4470]), GOOD],
    "wrong-types": [thread(thread_id=float("nan"), frames=[frame(line="12", name={"": "f"})])],
    "lone-surrogates": [thread(thread_name="a\udcffb", frames=[frame(filename="\ud800.py")])],
    "a-line-of-64-bits": [thread(frames=[frame(line=2**63)])],
}


@pytest.mark.parametrize("threads", list(DUMPS.values()), ids=list(DUMPS))
def test_a_pyspy_dump_of_any_shape_gives_rows_duckdb_loads(threads: List[Dict[str, Any]]) -> None:
    """py-spy prints what it reads in the job's memory: a field of another type than py-spy's own
    is left out (NULL), a lone surrogate is written as its escape, as the agent ships names."""
    rows = rows_from_dump(PID, threads)
    gil_holder(threads)
    assert rows and all(list(row) == BACKTRACE.column_names() and utf8_of_its_type(row) for row in rows)
    assert loaded(rows)


def test_a_pyspy_error_line_is_quoted_in_part() -> None:
    from probing.outside.pyspy import threads_of

    with pytest.raises(Exception) as refused:
        threads_of(PID, b"", b"Error: " + b"no such thing " * 2000)
    assert len(refused.value.args[0]) < 400


def core_document(**thread_fields: Any) -> bytes:
    frame_fields = {"file": "/x/job.py", "func": "train", "lineno": 12, "locals": {"step": "3"}}
    thread_fields = {"tid": 20354, "name": None, "holds_gil": True, "python_version": [3, 11],
                     "frames": [frame_fields], **thread_fields}  # fmt: skip
    reading = {"executable": "/usr/bin/python3.11", "pid": 20354, "threads": [thread_fields]}
    return json.dumps({"reading": reading}).encode()


def core_frame(**fields: Any) -> Dict[str, Any]:
    return dict({"file": "/x/job.py", "func": "train", "lineno": 12, "locals": {"step": "3"}}, **fields)


DOCUMENTS = {
    "frames-a-number": core_document(frames=5),
    "lineno-of-64-bits": core_document(frames=[core_frame(lineno=2**63)]),
    "a-thread-id-below-64-bits": core_document(tid=-(2**63) - 1),
    "lone-surrogates": core_document(frames=[core_frame(file="/x/\udcff.py", func="f\ud800")]),
    "lone-surrogates-in-locals": core_document(frames=[core_frame(locals={"\ud800": "\udcff"})]),
}


@pytest.mark.parametrize("document", list(DOCUMENTS.values()), ids=list(DOCUMENTS))
def test_a_core_reading_of_any_shape_can_be_queried(document: bytes) -> None:
    """The reader prints what pystack read in the core; `probing core CORE query` loads its rows."""
    reading = parse_reading("core.1", 0, document, b"")
    assert all(utf8_of_its_type(row) for row in reading.rows)
    query_core(reading, "SELECT * FROM python.backtrace")


@pytest.mark.parametrize("message", ["", "   ", "x" * 70_000])
@pytest.mark.parametrize("kind", ["NotFound", "RemoteError", "SomethingNewer"])
def test_an_agent_error_says_something_in_one_short_line(kind: str, message: str) -> None:
    error = error_from_reply({"type": kind, "message": message, "traceback": "Traceback ...\n"})
    assert error.message.strip()
    assert len(error.message) <= 4000


def test_a_malformed_table_is_refused_in_one_short_line() -> None:
    """The table's column type, name and offsets are the job's: quoted in part."""
    column = {"name": "n" * 70_000, "type": "x" * 70_000, "encoding": "i64", "offset": 0, "length": 8}
    descriptor = {"name": "python.threads", "rows": 1, "byteorder": "little", "columns": [column]}
    with pytest.raises(BadReply) as refused:
        decode_reply_table({"table": descriptor}, bytearray(8))
    assert len(refused.value.message) < 400
    column.update(type="BIGINT", offset="9" * 5000)
    with pytest.raises(FrameError) as malformed:
        decode_table(descriptor, bytearray(8))
    assert len(str(malformed.value)) < 400
