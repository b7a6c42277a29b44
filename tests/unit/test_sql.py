"""DuckDB over agent tables, in the CLI's process: types, NULLs, the seed queries, errors."""

from __future__ import annotations

import datetime
from typing import Any, List, Sequence, Tuple

import pytest

from probing.agent.columns import TableBuilder
from probing.errors import BadSQL, ExitCode
from probing.protocol.tables import DecodedTable, decode_table
from probing.schema.tables import AGENT_TABLES as TABLES
from probing.sql.session import SqlSession, sql_error

SEED_QUERIES = [
    "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10",
    "SELECT func, file, lineno FROM python.backtrace WHERE depth = 0",
    "SELECT func, file, lineno FROM python.backtrace WHERE depth < 5",
]


def shipped(name: str, columns: Sequence[Tuple[str, str]], rows: List[Tuple[Any, ...]]) -> DecodedTable:
    """A table as the CLI receives it: built by the agent's builder, through the codec."""
    builder = TableBuilder(name, columns)
    for row in rows:
        builder.append(row)
    descriptor, chunks = builder.encode()
    return decode_table(descriptor, bytearray(b"".join(bytes(chunk) for chunk in chunks)))


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


def bad_sql(session: SqlSession, sql: str) -> BadSQL:
    """The error a query raises, checked for what every SQL error shares: exit code 9, one
    line of DuckDB's message behind "SQL: ", the rest (hint, pointer) below it."""
    with pytest.raises(BadSQL) as raised:
        session.run(sql)
    error = raised.value
    assert error.exit_code == ExitCode.BAD_SQL
    assert error.message.startswith("SQL: ") and "\n" not in error.message
    return error


def test_an_unknown_schema_names_the_schema(session: SqlSession) -> None:
    error = bad_sql(session, "SELECT * FROM nosuchschema.t")
    assert "Catalog Error" in error.message and 'schema "nosuchschema" does not exist' in error.message
    assert error.hint is not None and "LINE 1: SELECT * FROM nosuchschema.t" in error.hint


def test_an_unknown_column_names_it_and_the_columns_that_exist(session: SqlSession) -> None:
    error = bad_sql(session, "SELECT nosuch FROM python.backtrace")
    assert error.message.startswith('SQL: Binder Error: Referenced column "nosuch" not found')
    assert error.hint is not None
    assert "Candidate bindings" in error.hint and "LINE 1: SELECT nosuch FROM python.backtrace" in error.hint


def test_a_syntax_error_at_the_end_names_the_last_word(session: SqlSession) -> None:
    error = bad_sql(session, "SELECT func FROM python.backtrace WHERE")
    assert error.message == 'SQL: Parser Error: syntax error at or near "WHERE"'
    # The pointer sits under the word once the hint is shown as the CLI shows it.
    assert error.hint is not None
    query, pointer = ("  hint: " + error.hint).split("\n")[-2:]
    assert query.endswith("LINE 1: SELECT func FROM python.backtrace WHERE")
    assert pointer.index("^") == query.index("WHERE")


def test_a_value_that_does_not_convert_is_a_conversion_error(session: SqlSession) -> None:
    error = bad_sql(session, "SELECT CAST(func AS INTEGER) FROM python.backtrace")
    assert "Conversion Error" in error.message and "Could not convert string" in error.message
    assert "INT32" in error.message


def test_a_function_over_the_wrong_type_lists_the_candidates(session: SqlSession) -> None:
    error = bad_sql(session, "SELECT sum(func) FROM python.backtrace")
    assert (
        error.message.startswith("SQL: Binder Error: No function matches") and "sum(VARCHAR)" in error.message
    )
    assert error.hint is not None and "sum(arg BIGINT" in error.hint


def test_a_query_parameter_without_a_value_is_an_sql_error(session: SqlSession) -> None:
    error = bad_sql(session, "SELECT func FROM python.backtrace WHERE lineno = ?")
    assert "Invalid Input Error" in error.message


@pytest.mark.parametrize("sql", ["", "   ", "-- only a comment"])
def test_a_query_with_no_statement_is_an_sql_error(session: SqlSession, sql: str) -> None:
    """DuckDB answers a query without a statement with no cursor at all."""
    assert "no statement" in bad_sql(session, sql).message


def test_sql_error_keeps_duckdbs_first_line_and_indents_the_rest() -> None:
    error = sql_error(RuntimeError("Binder Error: no\n\nLINE 1: SELECT x\n       ^"))
    assert error.message == "SQL: Binder Error: no"
    assert error.hint == "LINE 1: SELECT x\n               ^"  # 8 spaces: under "  hint: "
    assert sql_error(RuntimeError("Parser Error: one line")).hint is None


def test_sql_error_with_no_text_names_the_error_type() -> None:
    assert sql_error(ValueError("")).message == "SQL: ValueError"


def test_only_named_tables_are_fetched(session: SqlSession) -> None:
    assert session.referenced_tables("select * from python.threads t join backtrace b using (pid)") == [
        "python.backtrace",
        "python.threads",
    ]
    assert session.referenced_tables("select 1") == []
    assert session.referenced_tables("select * from process.info") == ["process.info"]
    assert session.referenced_tables("select * from information_schema.tables") == []
