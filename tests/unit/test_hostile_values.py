"""Values a job writes that are not what they claim to be: lone surrogates in text, numbers that
are no time, table names and columns DuckDB cannot hold. Each reader and printer takes them."""

from __future__ import annotations

import array
import io
import json
import math
from typing import Any, Dict, List

import pytest

from probing.cli.render import inert, inert_lines
from probing.cli.render.record import when
from probing.cli.render.rows import write_rows
from probing.engine.records.fields import number, timestamp
from probing.engine.records.path import is_temporary_record
from probing.protocol.tables import ColumnBuffers, decode_table, encode_table
from probing.sql.session import SqlSession, table_problem


@pytest.mark.parametrize("code", [0xD800, 0xD83D, 0xDBFF, 0xDC00, 0xDC7F, 0xDC80, 0xDCFF, 0xDD00, 0xDFFF])
def test_every_lone_surrogate_is_shown_as_its_escape(code: int) -> None:
    shown = inert(f"a{chr(code)}b")
    assert shown == f"a\\u{code:04x}b"
    shown.encode("utf-8")  # what a strict stream does: no UnicodeEncodeError
    assert inert_lines(f"a{chr(code)}\n", io.StringIO()) == f"a\\u{code:04x}\n"


def test_csv_writes_lone_surrogates_as_their_escapes() -> None:
    out = io.StringIO()
    write_rows(["argv"], ["VARCHAR"], [("caf\ud83d",)], "csv", out)
    assert out.getvalue() == "argv\ncaf\\ud83d\n"
    out.getvalue().encode("utf-8")


@pytest.mark.parametrize("value", [1e30, -1.0, math.nan, math.inf, 10**400, True, "1"])
def test_a_number_that_is_no_time_is_none_and_prints_as_unknown(value: Any) -> None:
    assert timestamp(value) is None
    assert when(timestamp(value)) == "?"


def test_when_takes_what_the_clock_cannot_show() -> None:
    assert when(1e30) == when(math.nan) == when(-1e300) == "?"
    assert when(timestamp(1.7e9)).startswith("20")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400, True, None, "3"])
def test_a_number_is_finite(value: Any) -> None:
    assert number(value) is None


@pytest.mark.parametrize(
    ("name", "columns", "why"),
    [
        ("pg_catalog.pg_class", ["a"], "pg_catalog is a schema of DuckDB's own"),
        ("information_schema.tables", ["a"], "information_schema is a schema of DuckDB's own"),
        ("Main.x", ["a"], "Main is a schema of DuckDB's own"),
        ("memory.x", ["a"], "memory is a schema of DuckDB's own"),
        ("extra.t", [], "it has no columns"),
        ("extra.t", ["a", "A"], "two columns named 'A'"),
        ("extra.t", [""], "a column named ''"),
        ("extra.t", ["caf\ud83d"], "a column named 'caf\\ud83d'"),
        ("extra", ["a"], "not a schema.table name"),
        ("a.b.c", ["a"], "not a schema.table name"),
    ],
)
def test_a_table_duckdb_cannot_hold_is_named_with_why(name: str, columns: List[str], why: str) -> None:
    assert table_problem(name, [(column, "BIGINT") for column in columns]) == why


def test_a_column_type_is_one_of_probing_s_never_sql(tmp_path: Any) -> None:
    """A hostile agent's `tables` reply types a column with SQL of its own: written into the
    CREATE TABLE, it would run as the CLI's user (root), here writing a file."""
    planted = tmp_path / "planted.csv"
    kind = f"BIGINT); COPY (SELECT 'pwned' AS x) TO '{planted}' (FORMAT csv); CREATE TABLE extra.u (b BIGINT"
    session = SqlSession([{"name": "extra.t", "columns": [{"name": "a", "type": kind}]}])
    assert not planted.exists()
    assert list(session.tables) == []
    assert "which is no column type of probing's" in session.notes[0]


def test_a_session_leaves_out_what_it_cannot_hold_and_runs() -> None:
    described: List[Dict[str, Any]] = [
        {"name": "pg_catalog.pg_class", "columns": [{"name": "a", "type": "BIGINT"}]},
        {"name": "extra.none", "columns": []},
        {"name": "extra.kept", "columns": [{"name": "a", "type": "BIGINT"}]},
        {"name": "EXTRA.Kept", "columns": [{"name": "a", "type": "BIGINT"}]},
    ]
    session = SqlSession(described)
    assert list(session.tables) == ["extra.kept"]
    assert len(session.notes) == 3
    assert session.run("SELECT count(*) FROM extra.kept").rows == [(0,)]


def test_a_json_column_with_a_lone_surrogate_is_queried() -> None:
    """JSON carries the surrogate as `\\ud83d`, which DuckDB's JSON reader refuses."""
    text = json.dumps(["train.py", "caf\ud83d"])
    descriptor, chunks = encode_table(
        "process.info", 1, [ColumnBuffers("argv", "VARCHAR[]", bytes(4), None, [text])]
    )
    table = decode_table(descriptor, b"".join(bytes(chunk) for chunk in chunks))
    session = SqlSession([{"name": "process.info", "columns": [{"name": "argv", "type": "VARCHAR[]"}]}])
    session.load(table)
    assert session.run("SELECT argv[2] FROM process.info").rows == [("caf\\ud83d",)]


def test_a_timestamp_that_is_no_time_is_null_in_sql() -> None:
    values = [1.7e9, 1e294, -5.0, math.nan, math.inf]
    column = ColumnBuffers("ts", "TIMESTAMP", array.array("d", values).tobytes(), None, None)
    descriptor, chunks = encode_table("extra.times", len(values), [column])
    table = decode_table(descriptor, b"".join(bytes(chunk) for chunk in chunks))
    session = SqlSession([{"name": "extra.times", "columns": [{"name": "ts", "type": "TIMESTAMP"}]}])
    session.load(table)
    rows = session.run("SELECT ts IS NULL FROM extra.times").rows
    assert [row[0] for row in rows] == [False, True, True, True, True]


@pytest.mark.parametrize(
    ("name", "temporary"),
    [
        (".train-1-20260101-000000.probing.4242.tmp", True),
        ("/r/.train-1-20260101-000000.probing.4242.tmp", True),
        (".probing.4242.tmp", False),
        (".train.probing.x.tmp", False),
        ("train.probing.4242.tmp", False),
        (".train.probing.4242", False),
    ],
)
def test_a_record_being_written_is_told_by_its_name(name: str, temporary: bool) -> None:
    assert is_temporary_record(name) is temporary


@pytest.mark.parametrize("text", ["{", "not json", "[" * 950 + "]" * 950, '{"x": "\\ud83d"}'])
def test_a_json_column_that_holds_no_usable_json_is_written_as_its_text(text: str) -> None:
    """A record's (or a hostile agent's) `locals`: any text, or JSON nested deeper than the JSON
    writer can recurse."""
    out = io.StringIO()
    write_rows(["locals"], ["JSON"], [(text,)], "json", out)
    value = json.loads(out.getvalue())[0]["locals"]
    assert value == text or value == json.loads(text)
