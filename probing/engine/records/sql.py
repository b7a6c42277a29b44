"""DuckDB over a record's tables (`probing FILE query`), and the tables written out as Parquet or
CSV (`probing FILE export`). The same session as for a live process: every table this probing
knows exists (so information_schema and the seed queries work), filled from the record."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, NamedTuple, Sequence

import duckdb

from ...errors import BadSQL, ProbingError
from ...schema.rows import backtrace_values_of
from ...schema.tables import AGENT_TABLES, BACKTRACE, CLI_TABLES
from ...sql.session import SqlSession, notes_on_what_is_read, referenced_tables
from .record import Record

# The name of the file `export` writes the record's header into, beside the tables.
HEADER_FILE = "record.json"
# USE_TMP_FILE false: DuckDB writes straight into the file export made (see export_record).
EXPORT_FORMATS = {
    "parquet": "(FORMAT parquet, USE_TMP_FILE false)",
    "csv": "(FORMAT csv, HEADER true, USE_TMP_FILE false)",
}
LIVE_ONLY_HINT = (
    "{table} is read from a live process with psutil, so a record cannot hold it; "
    "process.memory holds the job's memory over time and process.info the process"
)


def record_session(record: Record) -> SqlSession:
    """A session with every known table, those the record holds filled."""
    described = [table.describe() for table in AGENT_TABLES.values()]
    for table in record.tables:
        if table.name not in AGENT_TABLES:
            columns = [{"name": column.name, "type": column.type, "doc": ""} for column in table.columns]
            described.append({"name": table.name, "doc": "", "columns": columns})
    session = SqlSession(described)
    for table in record.tables:
        session.load(table)
    if record.kind == "fatal" and record.backtrace_rows:
        session.load_rows(BACKTRACE, [backtrace_values_of(row) for row in record.backtrace_rows])
    return session


class RecordQuery(NamedTuple):
    columns: List[str]
    types: List[str]
    rows: List[Any]
    notes: List[str]


def notes_about(notes: Sequence[str], tables: Sequence[str]) -> List[str]:
    """Those of a record's `notes` that name one of `tables` (`torch.cuda_memory is empty: ...`,
    `python.modules, python.optimizers: left out (...)`). A note about a table a query does not
    read is noise beside its rows; the record's heading (`probing FILE backtrace`) says them all."""
    patterns = [re.compile(rf"(?<![\w.]){re.escape(name)}(?![\w])") for name in tables]
    return [note for note in notes if any(pattern.search(note) for pattern in patterns)]


def query_record(record: Record, sql: str) -> RecordQuery:
    """`sql` over the record; notes about the tables it reads, and those it asks for that the
    record does not hold (once: a note of the record's that says why stands for it)."""
    held = set(record.table_names())
    known = list(AGENT_TABLES) + [table.name for table in record.tables]
    read = referenced_tables(known, sql)
    notes = notes_on_what_is_read(notes_about(record.notes, read), sql)
    unexplained = [name for name in read if name not in held and not notes_about(notes, [name])]
    if unexplained:
        notes.append(
            f"this record does not hold {', '.join(unexplained)} "
            f"(it holds {', '.join(sorted(held)) or 'no table'})"
        )
    session = record_session(record)
    try:
        result = session.run(sql)
    except BadSQL as error:
        live_only = referenced_tables(list(CLI_TABLES), sql)
        if live_only:
            raise BadSQL(error.message, hint=LIVE_ONLY_HINT.format(table=live_only[0])) from None
        raise
    return RecordQuery(result.columns, result.types, result.rows, notes)


class Exported(NamedTuple):
    directory: str
    files: List[Dict[str, Any]]  # {"table", "path", "rows", "bytes"} per table, then the header


def export_record(record: Record, directory: str, format: str, force: bool) -> Exported:
    """Every table of the record as DIRECTORY/TABLE.parquet (or .csv) through DuckDB's COPY, and
    its header as record.json. The directory is created (0700) if missing; files that exist are
    replaced only with `force` (checked for all before any is written).

    A record may hold secrets (locals, argv, exception text) and root exports other users'
    records, so every file is made 0600, under a temporary name created with O_EXCL|O_NOFOLLOW,
    written through its descriptor, and renamed onto its name: no write goes through a symlink
    or into a FIFO planted at a final name, and an entry in the way is replaced, never opened."""
    suffix = "." + format
    names = record.table_names()
    paths = {name: os.path.join(directory, name + suffix) for name in names}
    header_path = os.path.join(directory, HEADER_FILE)
    if not force:
        present = [path for path in [*paths.values(), header_path] if os.path.lexists(path)]
        if present:
            raise ProbingError(
                f"{present[0]} exists" + (f" (and {len(present) - 1} more)" if len(present) > 1 else ""),
                hint="--force replaces them, or export into another directory",
            )
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as error:
        raise ProbingError(f"cannot create {directory}: {error.strerror or error}", hint="") from None
    session = record_session(record)
    files: List[Dict[str, Any]] = []
    for name, path in paths.items():
        qualified = ".".join(f'"{part}"' for part in name.split("."))
        with _PrivateFile(path) as written:
            try:
                # DuckDB opens the path it is given: our own descriptor's, so the file made
                # above whatever the directory holds by now (and no tmp_ file of DuckDB's beside it).
                session.connection.execute(
                    f"COPY (SELECT * FROM {qualified}) TO '/proc/self/fd/{written.fd}' "
                    f"{EXPORT_FORMATS[format]}"
                )
                count = session.connection.execute(f"SELECT count(*) FROM {qualified}").fetchone()
            except duckdb.Error as error:
                raise ProbingError(f"writing {path}: {str(error).splitlines()[0]}", hint="") from None
        rows = int(count[0]) if count else 0
        files.append({"table": name, "path": path, "rows": rows, "bytes": written.size})
    header = json.dumps(dict(record.header, source_file=record.path), indent=2, sort_keys=True, default=str)
    with _PrivateFile(header_path) as written:
        with os.fdopen(os.dup(written.fd), "w", encoding="utf-8") as out:
            out.write(header + "\n")
    files.append({"table": None, "path": header_path, "rows": None, "bytes": written.size})
    return Exported(directory, files)


class _PrivateFile:
    """A new 0600 file under a temporary name beside `path`, renamed onto `path` when the block
    ends without an error (os.replace: a symlink, FIFO or file in the way is replaced, not
    written through), removed when it ends with one. `size`: its size once written."""

    def __init__(self, path: str) -> None:
        self.path = path
        directory, name = os.path.split(path)
        self.temporary = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
        self.fd = -1
        self.size = 0

    def __enter__(self) -> _PrivateFile:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self.fd = os.open(self.temporary, flags, 0o600)
        except OSError as error:
            raise ProbingError(f"cannot write {self.temporary}: {error.strerror or error}", hint="") from None
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        try:
            self.size = os.fstat(self.fd).st_size
        finally:
            os.close(self.fd)
        if kind is not None:
            _remove(self.temporary)
            return
        try:
            os.replace(self.temporary, self.path)
        except OSError as failure:
            _remove(self.temporary)
            raise ProbingError(f"cannot write {self.path}: {failure.strerror or failure}", hint="") from None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
