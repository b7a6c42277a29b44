"""DuckDB over agent tables, in the CLI's process: types, NULLs, the seed queries, errors."""

from __future__ import annotations

import datetime
from typing import Any, List, Sequence, Tuple

import pytest

from probing import protocol
from probing.agent.columns import TableBuilder
from probing.errors import BadSQL, ExitCode
from probing.schema.tables import AGENT_TABLES as TABLES
from probing.sql.session import SqlSession

SEED_QUERIES = [
    "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10",
    "SELECT func, file, lineno FROM python.backtrace WHERE depth = 0",
    "SELECT func, file, lineno FROM python.backtrace WHERE depth < 5",
]


def shipped(
    name: str, columns: Sequence[Tuple[str, str]], rows: List[Tuple[Any, ...]]
) -> protocol.DecodedTable:
    """A table as the CLI receives it: built by the agent's builder, through the codec."""
    builder = TableBuilder(name, columns)
    for row in rows:
        builder.append(row)
    descriptor, chunks = builder.encode()
    return protocol.decode_table(descriptor, bytearray(b"".join(bytes(chunk) for chunk in chunks)))


def backtrace_rows() -> List[Tuple[Any, ...]]:
    rows = []
    for thread, name in ((1, "MainThread"), (2, "worker")):
        for depth, func in enumerate(("wait", "loop", "main", "<module>", "run", "boot")):
            rows.append((10, thread, 100 + thread, name, thread == 1, depth, func, f"/x/{func}.py",
                         depth * 10 + 1, "Python", None, "agent"))  # fmt: skip
    return rows


@pytest.fixture
def session() -> SqlSession:
    described = [table.describe() for table in TABLES.values()]
    session = SqlSession(described)
    spec = TABLES["python.backtrace"]
    session.load(shipped(spec.name, [(c.name, c.type) for c in spec.columns], backtrace_rows()))
    return session


@pytest.mark.parametrize("sql", SEED_QUERIES)
def test_seed_queries_run_verbatim(session: SqlSession, sql: str) -> None:
    result = session.run(sql)
    assert result.columns[:3] == ["func", "file", "lineno"]
    assert result.rows


def test_innermost_frames_per_thread(session: SqlSession) -> None:
    result = session.run(SEED_QUERIES[1])
    assert sorted(result.rows) == [("wait", "/x/wait.py", 1), ("wait", "/x/wait.py", 1)]


def test_every_documented_table_exists_even_unfetched(session: SqlSession) -> None:
    # A fetched table is a view over columns registered in DuckDB's temp catalog.
    result = session.run(
        "SELECT table_schema || '.' || table_name FROM information_schema.tables "
        "WHERE table_catalog <> 'temp' ORDER BY 1"
    )
    assert [row[0] for row in result.rows] == sorted(TABLES)
    assert session.run("SELECT count(*) FROM python.threads").rows == [(0,)]


def test_unqualified_table_names_resolve(session: SqlSession) -> None:
    assert session.run("SELECT count(*) FROM backtrace").rows == [(12,)]


def test_types_and_nulls_survive_the_trip() -> None:
    columns = [("i", "BIGINT"), ("f", "DOUBLE"), ("b", "BOOLEAN"), ("s", "VARCHAR"),
               ("j", "JSON"), ("l", "VARCHAR[]"), ("t", "TIMESTAMP")]  # fmt: skip
    spec = {
        "name": "python.sample",
        "doc": "",
        "columns": [{"name": n, "type": t, "doc": ""} for n, t in columns],
    }
    session = SqlSession([spec])
    session.load(shipped("python.sample", columns, [
        (7, 1.5, True, "x", '{"a": [1]}', ["p", "q"], 1700000000.25),
        (None, None, None, None, None, None, None),
    ]))  # fmt: skip
    result = session.run("SELECT i, f, b, s, j->>'$.a[0]', l, t FROM sample ORDER BY i NULLS LAST")
    assert result.types == [
        "BIGINT",
        "DOUBLE",
        "BOOLEAN",
        "VARCHAR",
        "VARCHAR",
        "VARCHAR[]",
        "TIMESTAMP",
    ]
    assert result.rows == [
        (7, 1.5, True, "x", "1", ["p", "q"], datetime.datetime(2023, 11, 14, 22, 13, 20, 250000)),
        (None, None, None, None, None, None, None),
    ]


def test_nan_stays_nan_and_is_not_null() -> None:
    """DuckDB reads NaN in a numpy array as NULL; a NaN gradient norm must not look like none."""
    columns = [("f", "DOUBLE")]
    spec = {"name": "python.sample", "doc": "", "columns": [{"name": "f", "type": "DOUBLE", "doc": ""}]}
    session = SqlSession([spec])
    nan, inf = float("nan"), float("inf")
    session.load(shipped("python.sample", columns, [(1.5,), (nan,), (inf,), (None,)]))
    result = session.run("SELECT f IS NULL, isnan(f), f FROM sample")
    assert result.rows[0] == (False, False, 1.5)
    assert result.rows[1][:2] == (False, True)
    assert result.rows[2] == (False, False, inf)
    assert result.rows[3] == (True, None, None)


def test_bad_sql_is_one_line_plus_duckdbs_hint(session: SqlSession) -> None:
    with pytest.raises(BadSQL) as raised:
        session.run("SELECT * FROM python.backtraces")
    error = raised.value
    assert error.exit_code == ExitCode.BAD_SQL
    assert error.message.startswith("SQL: Catalog Error: Table with name backtraces does not exist")
    assert error.hint is not None and 'Did you mean "backtrace"' in error.hint


def test_syntax_error_points_into_the_query(session: SqlSession) -> None:
    with pytest.raises(BadSQL) as raised:
        session.run("SELEC 1")
    assert "syntax error" in raised.value.message
    assert raised.value.hint is not None and "SELEC 1" in raised.value.hint


def test_only_named_tables_are_fetched(session: SqlSession) -> None:
    assert session.referenced_tables("select * from python.threads t join backtrace b using (pid)") == [
        "python.backtrace",
        "python.threads",
    ]
    assert session.referenced_tables("select 1") == []
    assert session.referenced_tables("select * from process.info") == ["process.info"]
    assert session.referenced_tables("select * from information_schema.tables") == []
