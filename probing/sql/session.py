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

import json
import re
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from ..errors import BadSQL
from ..protocol.tables import ENCODING_OF_TYPE, DecodedColumn, DecodedTable
from ..schema.tables import Column, Table

_STAGING = "__probing_part"
# The names a table may have: `schema.table`, as the agents name them (a name also becomes a file
# name in `export`).
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\.[A-Za-z_][A-Za-z0-9_]{0,63}$")
# Schemas and catalogs DuckDB keeps for itself. A table named into one cannot be made
# (pg_catalog, information_schema: "Cannot create schema in system catalog"), or makes every
# name of that schema ambiguous (memory, system, temp: the attached databases), or lands among
# what the session makes (main). DuckDB compares names ignoring case, and so does this.
RESERVED_SCHEMAS = frozenset({"main", "temp", "system", "memory", "pg_catalog", "information_schema"})
# Seconds since the epoch that a TIMESTAMP column may hold (1970 to the end of year 9999): beyond,
# x * 1e6 overflows BIGINT (from 9.2e12) or DuckDB hands back text instead of a datetime. A value
# outside (a byte-swapped or hostile column: 1e294, NaN) is NULL, as a value that is no time.
_LATEST_TIMESTAMP_S = 253402300799
# A \u escape of a surrogate in JSON text: DuckDB's JSON reader refuses a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


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
        # NaN compares above every number in DuckDB: BETWEEN leaves it out too.
        value = (
            f"CASE WHEN {data} BETWEEN 0 AND {_LATEST_TIMESTAMP_S} "
            f"THEN make_timestamp(CAST(round({data} * 1000000) AS BIGINT)) END"
        )
    else:
        value = f"CAST({data} AS {kind})"
    if nan:
        # DuckDB reads a NaN in a registered numpy array as NULL (pandas' convention); a NaN
        # gradient norm or duration must stay NaN, which is not the same as "none".
        value = f"CASE WHEN {nan} = 1 THEN CAST('nan' AS DOUBLE) ELSE {value} END"
    if column.valid is not None:
        return f"CASE WHEN {valid} = 1 THEN {value} END"
    return value


def _plain(kind: str, value: Any) -> Any:
    """A plain Python value as DuckDB can take it: a TIMESTAMP that is no time (see
    _LATEST_TIMESTAMP_S) is NULL, and a lone surrogate in text its escape (DuckDB refuses text
    that is not UTF-8: a file name of bytes py-spy decoded with surrogateescape)."""
    if kind == "TIMESTAMP" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value if 0 <= value <= _LATEST_TIMESTAMP_S else None  # NaN fails both: NULL
    if isinstance(value, str):
        return without_surrogates(value)
    return value


def without_surrogates(text: str) -> str:
    """`text` with each lone surrogate as its escape (`\\ud83d`), as render.inert shows it."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _json_word(word: str) -> str:
    """A JSON text of a JSON, VARCHAR[] or BIGINT[] column as DuckDB's JSON reader takes it.

    JSON carries a lone surrogate as an escape (`"\\ud83d"`: argv that a job decoded from broken
    UTF-8), which DuckDB refuses ("no low surrogate in string"), failing every query of the
    table. Such a string is written again with the surrogate as the text of its escape, as the
    protocol sends a plain VARCHAR (protocol/tables.py: backslashreplace)."""
    if not _SURROGATE_ESCAPE.search(word):
        return word
    try:
        value = json.loads(word)
    except (ValueError, RecursionError):
        return word  # not JSON: DuckDB says so, of this column's values, when a query reads them
    return json.dumps(_escaped_surrogates(value))


def _word(kind: str, text: str) -> str:
    """A dictionary word of a column of type `kind` as DuckDB is given it."""
    return text if kind == "VARCHAR" else _json_word(text)


def _escaped_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return without_surrogates(value)
    if isinstance(value, list):
        return [_escaped_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {without_surrogates(key): _escaped_surrogates(item) for key, item in value.items()}
    return value


def table_problem(name: str, columns: Sequence[Tuple[str, str]]) -> Optional[str]:
    """Why a table of this name and these (name, type) columns cannot be one of a session's, in
    words ("it has no columns"); None when it can. A job names its tables and types its columns
    (a record's, a hostile agent's `tables` reply): DuckDB cannot make a table without columns,
    with two columns of one name (case ignored), with a column named "" or with a name that is
    not UTF-8, nor one in a schema of its own (RESERVED_SCHEMAS). A type is one the protocol
    knows (ENCODING_OF_TYPE), never other text: it is written into the CREATE TABLE as it is, and
    `BIGINT); COPY (...) TO '/root/...'` would be the job's SQL run by root."""
    if not _TABLE_NAME.match(name):
        return "not a schema.table name"
    schema = name.split(".")[0]
    if schema.lower() in RESERVED_SCHEMAS:
        return f"{schema} is a schema of DuckDB's own"
    if not columns:
        return "it has no columns"
    seen = set()
    for column, kind in columns:
        if not column or without_surrogates(column) != column:
            return f"a column named {column[:80]!r}"
        if column.lower() in seen:
            return f"two columns named {column[:80]!r}"
        if kind not in ENCODING_OF_TYPE:
            return f"column {column[:80]!r} has type {kind[:80]!r}, which is no column type of probing's"
        seen.add(column.lower())
    return None


def referenced_tables(names: Sequence[str], sql: str) -> List[str]:
    """Those of `names` whose name appears in the query (one too many is cheap, one too few wrong)."""
    found = []
    for name in names:
        short = name.split(".")[-1]
        if re.search(rf"(?<![\w$]){re.escape(short)}(?![\w$])", sql, re.IGNORECASE):
            found.append(name)
    return found


# A note that columns were left NULL: "python.gc_generations: objects left NULL: ...",
# "python.modules: grad_norm and has_nonfinite_grad left NULL: ...".
_NULL_COLUMNS = re.compile(r"^[\w.]+: ([\w, ]+?) left NULL\b")


def notes_on_what_is_read(notes: Sequence[str], sql: str) -> List[str]:
    """The notes that matter to `sql`: one that columns were left NULL only where the query reads
    one of them (by name, or `*`); a query of a table's other columns hears nothing of them."""
    kept = []
    for note in notes:
        null = _NULL_COLUMNS.match(note)
        if null is not None and "*" not in sql:
            columns = re.split(r", | and ", null.group(1))
            if not any(re.search(rf"(?<![\w$]){re.escape(c)}(?![\w$])", sql, re.IGNORECASE) for c in columns):
                continue
        kept.append(note)
    return kept


class SqlSession:
    """DuckDB over fetched tables. `added`: columns every table gains (name, type), whose value
    each load gives as a constant: `rank`, `local_rank` and `node` when the rows of many ranks
    go into one table. A table that has such a column already takes the given value too."""

    def __init__(self, tables: List[Dict[str, Any]], added: Sequence[Column] = ()) -> None:
        import duckdb

        self._duckdb = duckdb
        self._connection = duckdb.connect(":memory:")
        self._sealed = False
        self._unbuilt: List[str] = []  # tables whose parts came since their view was made
        self._views: Set[str] = set()  # tables made a view of their parts
        self.added = [(column.name, column.type) for column in added]
        # Why tables were left out (a hostile agent may describe any name and any columns).
        self.notes: List[str] = []
        self.tables: Dict[str, Dict[str, Any]] = {}
        seen = set()
        for table in tables:
            name = str(table.get("name"))
            described = [
                (str(column.get("name")), str(column.get("type"))) for column in table.get("columns") or []
            ]
            problem = table_problem(name, described)
            if problem is None and name.lower() in seen:
                problem = "a second table of that name"
            if problem is not None:
                self.notes.append(f"a table named {name!r} was left out: {problem}")
                continue
            seen.add(name.lower())
            self.tables[name] = with_columns(table, added)
        schemas = sorted({name.split(".")[0] for name in self.tables})
        for schema in schemas:
            self._connection.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(schema)}")
        for name, table in self.tables.items():
            columns = ", ".join(f"{_quote(c['name'])} {c['type']}" for c in table["columns"])
            self._connection.execute(f"CREATE TABLE {_qualified(name)} ({columns})")
        # Unqualified names work too: SELECT * FROM backtrace.
        search_path = ",".join([*schemas, "main"])
        self._connection.execute(f"SET search_path = '{search_path}'")
        self.parts: Dict[str, List[Any]] = {}  # table -> its loads (parts.Part)
        self.staged = 0

    def referenced_tables(self, sql: str) -> List[str]:
        """Tables whose name appears in the query (one too many is cheap, one too few wrong)."""
        return referenced_tables(list(self.tables), sql)

    def load(self, table: DecodedTable, constants: Optional[Dict[str, Any]] = None) -> None:
        """Make the rows of a fetched table what its name shows (a second load adds rows);
        `constants` give the added columns' values for these rows."""
        if table.rows == 0 or not self._takes(
            table.name, [(column.name, column.type) for column in table.columns]
        ):
            return  # an empty table is its CREATE TABLE; one left out (see notes) has none
        from .parts import part_of_table

        self._add_part(table.name, part_of_table(table, constants))

    def _takes(self, name: str, columns: Sequence[Tuple[str, str]]) -> bool:
        """Whether rows of table `name` with these columns can be loaded: a table the session
        made, and columns DuckDB can name (a hostile agent's reply may differ from its
        description); a note says why not."""
        if name not in self.tables:
            return False
        problem = table_problem(name, columns)
        if problem is not None:
            self.notes.append(f"the rows of {name} were left out: {problem}")
        return problem is None

    def load_rows(
        self, table: Table, rows: Sequence[Sequence[Any]], constants: Optional[Dict[str, Any]] = None
    ) -> None:
        """Add plain rows (tuples in the order of `table`'s columns) to what its name shows:
        for tables this process builds itself (process.stats, stacks read from outside),
        which never pass through the wire format. TIMESTAMP values are seconds since the epoch,
        JSON values their text, as the agent's columns carry them."""
        if not rows or not self._takes(table.name, [(column.name, column.type) for column in table.columns]):
            return
        from .parts import part_of_rows

        self._add_part(table.name, part_of_rows(table, rows, _plain, constants))

    def _add_part(self, name: str, part: Any) -> None:
        self.parts.setdefault(name, []).append(part)
        if name not in self._unbuilt:
            self._unbuilt.append(name)

    @property
    def connection(self) -> Any:
        """The DuckDB connection, each table made of every load so far: made when read, once
        for all the loads before (a view re-made at every load of 1 024 ranks took minutes)."""
        while self._unbuilt:
            self._build(self._unbuilt.pop())
        return self._connection

    def _build(self, name: str) -> None:
        """Table `name` as one registered set of columns (parts.py), read through a view that
        gives each column its type and its NULLs."""
        import numpy

        from .parts import encoding_of, merged

        self.staged += 1
        part = f"{_STAGING}{self.staged}"
        added = [added_name for added_name, _ in self.added]
        described = [(str(column["name"]), str(column["type"])) for column in self.tables[name]["columns"]]
        columns = merged(described, added, self.parts[name], _word)
        staged: Dict[str, Any] = {}
        expressions = []
        for index, ((column_name, kind), piece) in enumerate(zip(described, columns.values())):
            data, valid, words, nan = f"c{index}", f"v{index}", f"{part}_words{index}", ""
            staged[data] = piece.data
            if piece.valid is not None:
                staged[valid] = piece.valid
            if kind == "DOUBLE":
                is_nan = numpy.isnan(piece.data)
                if is_nan.any():
                    nan = f"n{index}"
                    staged[nan] = is_nan.astype(numpy.int8)
            column = DecodedColumn(column_name, kind, encoding_of(kind), [], piece.valid, None)
            if column.encoding == "dict":
                dictionary = numpy.array(list(piece.words or []), dtype=object)
                self._connection.register(words, {"code": numpy.arange(len(dictionary)), "word": dictionary})
            expressions.append(
                f"{_column_expression(column, data, valid, words, nan)} AS {_quote(column_name)}"
            )
        self._connection.register(part, staged)
        qualified = _qualified(name)
        if name not in self._views:
            self._views.add(name)
            self._connection.execute(f"DROP TABLE {qualified}")
        self._connection.execute(
            f"CREATE OR REPLACE VIEW {qualified} AS SELECT {', '.join(expressions)} FROM {part}"
        )

    def run(self, sql: str) -> QueryResult:
        """The user's SQL, over the tables alone: before the first, DuckDB's access to files,
        extensions and settings is closed for good (no COPY TO, read_csv, ATTACH, INSTALL, SET:
        a query reads what the job showed and writes nothing; `export` writes through
        `connection` itself)."""
        connection = self.connection
        if not self._sealed:
            connection.execute("SET enable_external_access = false")
            connection.execute("SET lock_configuration = true")
            self._sealed = True
        try:
            cursor = connection.execute(sql)
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
