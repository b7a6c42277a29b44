"""DuckDB over tables fetched from an agent, in the CLI's own process (DESIGN.md says why).

Every table the agent documents exists in the session (so information_schema and `DESCRIBE`
see them all); only the tables a query names are fetched and filled.

A fetched table is not copied into DuckDB: its columns stay where the reply put them, mapped by
numpy, and the table becomes a view over them; strings arrive as codes into a dictionary and are
looked up when a query reads them. Copying a million-row python.torch_trace into a DuckDB table
took half a second; the view costs a few milliseconds and the query reads only its columns.
The registered columns show in information_schema under the `temp` catalog, as __probing_part*.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..errors import BadSQL
from ..protocol import DecodedColumn, DecodedTable
from ..schema.tables import Column, Table

_STAGING = "__probing_part"


class QueryResult(NamedTuple):
    columns: List[str]
    types: List[str]
    rows: List[Tuple[Any, ...]]


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _qualified(name: str) -> str:
    return ".".join(_quote(part) for part in name.split("."))


def _column_expression(column: DecodedColumn, data: str, valid: str, words: str, nan: str = "") -> str:
    """SQL that turns a staged numpy column back into its typed, NULL-aware value. `nan`: the
    staged mask of NaN values, for a DOUBLE column that holds any."""
    kind = column.type
    if column.encoding == "dict":
        # Codes index the dictionary from 0; -1 (NULL) becomes index 0, which list_extract
        # answers with NULL.
        data = f"list_extract((SELECT list(word ORDER BY code) FROM {words}), {data} + 1)"
    if kind == "BOOLEAN":
        return f"CASE WHEN {data} < 0 THEN NULL ELSE {data} <> 0 END"
    if kind == "JSON":
        return f"CAST({data} AS JSON)"
    if kind in ("VARCHAR[]", "BIGINT[]"):
        return f"from_json({data}, '[\"{kind[:-2]}\"]')"
    if kind == "TIMESTAMP":
        value = f"make_timestamp(CAST(round({data} * 1000000) AS BIGINT))"
    else:
        value = f"CAST({data} AS {kind})"
    if nan:
        # DuckDB reads a NaN in a registered numpy array as NULL (pandas' convention); a NaN
        # gradient norm or duration must stay NaN, which is not the same as "none".
        value = f"CASE WHEN {nan} = 1 THEN CAST('nan' AS DOUBLE) ELSE {value} END"
    if column.valid is not None:
        return f"CASE WHEN {valid} = 1 THEN {value} END"
    return value


def _plain_value(kind: str) -> str:
    """The parameter of an INSERT for a plain Python value of a column of type `kind`."""
    if kind == "TIMESTAMP":
        return "make_timestamp(CAST(round(? * 1000000) AS BIGINT))"
    return f"CAST(? AS {kind})"


def _numpy_column(column: DecodedColumn) -> Any:
    import numpy

    data: Any = column.data
    dtypes = {"i64": numpy.int64, "f64": numpy.float64, "bool": numpy.int8, "dict": numpy.int32}
    return numpy.frombuffer(data, dtype=dtypes[column.encoding])


def referenced_tables(names: Sequence[str], sql: str) -> List[str]:
    """Those of `names` whose name appears in the query (one too many is cheap, one too few wrong)."""
    found = []
    for name in names:
        short = name.split(".")[-1]
        if re.search(rf"(?<![\w$]){re.escape(short)}(?![\w$])", sql, re.IGNORECASE):
            found.append(name)
    return found


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


class SqlSession:
    """DuckDB over fetched tables. `added`: columns every table gains (name, type), whose value
    each load gives as a constant: `rank`, `local_rank` and `node` when the rows of many ranks
    go into one table. A table that has such a column already takes the given value too."""

    def __init__(self, tables: List[Dict[str, Any]], added: Sequence[Column] = ()) -> None:
        import duckdb

        self._duckdb = duckdb
        self.connection = duckdb.connect(":memory:")
        self.added = [(column.name, column.type) for column in added]
        tables = [with_columns(table, added) for table in tables]
        self.tables = {table["name"]: table for table in tables}
        schemas = sorted({name.split(".")[0] for name in self.tables})
        for schema in schemas:
            self.connection.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(schema)}")
        for name, table in self.tables.items():
            columns = ", ".join(f"{_quote(c['name'])} {c['type']}" for c in table["columns"])
            self.connection.execute(f"CREATE TABLE {_qualified(name)} ({columns})")
        # Unqualified names work too: SELECT * FROM backtrace.
        search_path = ",".join([*schemas, "main"])
        self.connection.execute(f"SET search_path = '{search_path}'")
        self.parts: Dict[str, List[str]] = {}  # table -> SELECTs over its staged parts
        self.staged = 0

    def referenced_tables(self, sql: str) -> List[str]:
        """Tables whose name appears in the query (one too many is cheap, one too few wrong)."""
        return referenced_tables(list(self.tables), sql)

    def load(self, table: DecodedTable, constants: Optional[Dict[str, Any]] = None) -> None:
        """Make the rows of a fetched table what its name shows (a second load adds rows);
        `constants` give the added columns' values for these rows."""
        if table.rows == 0:
            return
        import numpy

        self.staged += 1
        part = f"{_STAGING}{self.staged}"
        staged: Dict[str, Any] = {}
        expressions = []
        for index, column in enumerate(table.columns):
            data, valid, words = f"c{index}", f"v{index}", f"{part}_words{index}"
            staged[data] = _numpy_column(column)
            if column.valid is not None:
                validity: Any = column.valid
                staged[valid] = numpy.frombuffer(validity, dtype=numpy.int8)
            nan = ""
            if column.type == "DOUBLE":
                is_nan = numpy.isnan(staged[data])
                if is_nan.any():
                    nan = f"n{index}"
                    staged[nan] = is_nan.astype(numpy.int8)
            if column.encoding == "dict":
                dictionary = column.dictionary or []
                self.connection.register(
                    words,
                    {"code": numpy.arange(len(dictionary)), "word": numpy.array(dictionary, dtype=object)},
                )
            expressions.append(
                f"{_column_expression(column, data, valid, words, nan)} AS {_quote(column.name)}"
            )
        if self.added:
            names = [column.name for column in table.columns]
            expressions = self._with_constants(names, expressions, constants or {})
        self.connection.register(part, staged)
        self._add_part(table.name, f"SELECT {', '.join(expressions)} FROM {part}")

    def _with_constants(
        self, names: List[str], expressions: List[str], constants: Dict[str, Any]
    ) -> List[str]:
        """The SELECT list of a part with the added columns: a column the table has takes the
        constant in its place, the others come after the table's own, in the session's order."""
        kinds = dict(self.added)
        chosen = list(expressions)
        for index, name in enumerate(names):
            if name in kinds:
                chosen[index] = f"CAST({_literal(constants.get(name))} AS {kinds[name]}) AS {_quote(name)}"
        for name, kind in self.added:
            if name not in names:
                chosen.append(f"CAST({_literal(constants.get(name))} AS {kind}) AS {_quote(name)}")
        return chosen

    def load_rows(
        self, table: Table, rows: Sequence[Sequence[Any]], constants: Optional[Dict[str, Any]] = None
    ) -> None:
        """Add plain rows (tuples in the order of `table`'s columns) to what its name shows:
        for tables this process builds itself (process.stats, stacks read from outside),
        which never pass through the wire format. TIMESTAMP values are seconds since the epoch,
        JSON values their text, as the agent's columns carry them."""
        if not rows:
            return
        self.staged += 1
        part = f"{_STAGING}{self.staged}"
        columns = ", ".join(f"{_quote(column.name)} {column.type}" for column in table.columns)
        self.connection.execute(f"CREATE TEMP TABLE {part} ({columns})")
        values = ", ".join(_plain_value(column.type) for column in table.columns)
        self.connection.executemany(f"INSERT INTO {part} VALUES ({values})", [list(row) for row in rows])
        select = "*"
        if self.added:
            names = table.column_names()
            select = ", ".join(self._with_constants(names, [_quote(name) for name in names], constants or {}))
        self._add_part(table.name, f"SELECT {select} FROM {part}")

    def _add_part(self, name: str, select: str) -> None:
        selects = self.parts.setdefault(name, [])
        selects.append(select)
        qualified = _qualified(name)
        if len(selects) == 1:
            self.connection.execute(f"DROP TABLE {qualified}")
        # By name: ranks whose agents differ by a version may send a column more or fewer.
        self.connection.execute(
            f"CREATE OR REPLACE VIEW {qualified} AS {' UNION ALL BY NAME '.join(selects)}"
        )

    def run(self, sql: str) -> QueryResult:
        try:
            cursor = self.connection.execute(sql)
            if cursor is None:  # DuckDB's answer to a query of blanks and comments
                raise BadSQL("SQL: there is no statement in the query (only blanks or comments)")
            description = cursor.description or []
            rows = cursor.fetchall() if description else []
        except self._duckdb.Error as error:
            raise sql_error(error) from None
        return QueryResult([d[0] for d in description], [str(d[1]) for d in description], rows)


def with_columns(table: Dict[str, Any], added: Sequence[Column]) -> Dict[str, Any]:
    """A table's description with the `added` columns it lacks appended."""
    have = {column["name"] for column in table["columns"]}
    extra = [column._asdict() for column in added if column.name not in have]
    return dict(table, columns=list(table["columns"]) + extra) if extra else table


def sql_error(error: Exception) -> BadSQL:
    """DuckDB's message in one line; its hint and the pointer into the query below it."""
    # DuckDB indents its candidate lists with tabs; the hint is indented with spaces.
    lines = [line.replace("\t", "    ") for line in str(error).splitlines() if line.strip()]
    message = lines[0] if lines else type(error).__name__
    return BadSQL(f"SQL: {message}", hint="\n        ".join(lines[1:]) or None)
