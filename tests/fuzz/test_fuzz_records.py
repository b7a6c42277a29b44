"""Record files as the CLI reads them: a `.probing` file (protocol/records.py's frames, the header's
fields, each table's columns: engine/records/record.py) and a `.fatal` file (its header line, then
faulthandler's text: engine/fatal_text.py), through every command a record answers and the
`probing records` listing, printed to a strict UTF-8 stream (a lone surrogate that reaches it
fails the write, as it would a terminal's). Seeds: files real agents wrote
(capture_record_corpus.py). A record is another user's file that root reads: its bytes are the
job's, every one of them."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from harness import (
    BYTES,
    INTERESTING_VALUES,
    SCRATCH_BYTES,
    Draw,
    dump_json,
    frames,
    fuzzes,
    join_frames,
    split_frames,
    text_values,
)
from hypothesis import strategies as st

from probing.cli.pictures.report import report_page
from probing.cli.render.files import write_output
from probing.cli.render.record import (
    write_record_hang,
    write_record_memory,
    write_record_stacks,
    write_records,
)
from probing.cli.render.reports import write_tables
from probing.cli.render.rows import write_rows
from probing.engine.fatal_text import parse_faulthandler
from probing.engine.records.listing import list_records
from probing.engine.records.record import open_record
from probing.engine.records.reports import record_hang, record_memory
from probing.engine.records.sql import export_record, query_record
from probing.engine.records.stacks import record_stacks
from probing.engine.report.record import gather_record

# What every record answers to: SQL over the tables the agent writes, as the docs show it.
QUERIES = (
    "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10",
    "SELECT * FROM process.memory ORDER BY ts",
    "SELECT argv, * FROM process.info",
    "SELECT module, stage, avg(duration) FROM python.torch_trace GROUP BY ALL",
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A record directory (0700, as the agent makes it) that holds one input at a time."""
    directory = tmp_path_factory.mktemp("records")
    directory.chmod(0o700)
    return directory


def written(folder: Path, name: str, data: bytes) -> str:
    for old in folder.iterdir():
        old.unlink()
    path = folder / name
    path.write_bytes(data)
    return str(path)


def strict_stdout() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)


def printed(folder: Path, path: str) -> Dict[str, Any]:
    """What the listing and each command a record answers print of `path`, as the CLI prints it."""
    out = strict_stdout()
    answers: Dict[str, Any] = {}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        entries = list_records([str(folder)], given=True)
        write_records(entries, "text", [str(folder)])
        write_records(entries, "json", [str(folder)])
        answers["listed"] = entries
        record = open_record(path)  # BadRecord: the refusal, exit 15
        stacks = record_stacks(record, True, None)
        for format in ("text", "json", "csv"):
            write_record_stacks(record, stacks, format)
        memory = record_memory(record)
        for format in ("text", "json"):
            write_record_memory(memory, format)
        hang = record_hang(record, lambda frame: "")
        for format in ("text", "json"):
            write_record_hang(hang, format)
        write_tables(record.described(), "text")
        answers.update(rows=stacks.rows, memory=memory, hang=hang)
    return answers


def at_most_its_own_line(answer: Dict[str, Any]) -> Any:
    """The listing holds the one file, whatever it holds (unreadable: its own line), or nothing
    when it is the armed `.fatal` file of a process that runs (its header's PID, PID 1 say)."""
    return None if len(answer["listed"]) <= 1 else f"the listing holds {len(answer['listed'])} entries"


RECORD_MAGIC_BYTES = 8
# Values a header field or a table's name may be given: those of the harness, and what broke the
# reader before (a time that is no time, text that is not UTF-8, a schema of DuckDB's own).
HEADER_VALUES = INTERESTING_VALUES + (1e30, -1e30, 10**400, "caf\ud83d", ["a\ud800", "\udcff"])
TABLE_NAMES = ("pg_catalog.pg_class", "information_schema.tables", "main.x", "temp.y", "memory.m",
               "system.s", "PYTHON.BACKTRACE", "process.memory", "a", "a.b.c", "", "x.\ud83d")  # fmt: skip


def _record_frames(draw: Draw, data: bytes) -> Optional[List[Tuple[bytes, bytes]]]:
    parsed = split_frames(data, RECORD_MAGIC_BYTES)
    return list(parsed) if parsed else None


def _object(header: bytes) -> Optional[Dict[str, Any]]:
    """A frame's header as a JSON object, or None (an earlier mutation may have broken it)."""
    try:
        value = json.loads(header.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _field(draw: Draw, value: Dict[str, Any]) -> Tuple[Dict[str, Any], str]:
    """A dict of the header (itself, or reason, exception, rank) and one of its keys."""
    holders = [value] + [
        value[key] for key in ("reason", "exception", "rank") if isinstance(value.get(key), dict)
    ]
    holder = draw(st.sampled_from(holders))
    keys = sorted(holder) or ["written_at"]
    return holder, draw(st.sampled_from(keys))


def record_header(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
    """One field of a record's header (its first frame) given a value a job could write there."""
    stream = _record_frames(draw, data)
    value = _object(stream[0][0]) if stream else None
    if stream is None or value is None:
        return draw(st.sampled_from(BYTES))(draw, data, seeds)  # type: ignore[no-any-return]
    holder, key = _field(draw, value)
    holder[key] = draw(st.sampled_from(HEADER_VALUES))
    stream[0] = (dump_json(draw, value), stream[0][1])
    return data[:RECORD_MAGIC_BYTES] + join_frames(stream)


def table_descriptor(draw: Draw, data: bytes, seeds: Sequence[bytes]) -> bytes:
    """One table of a record renamed, its byte order flipped, its columns dropped, repeated or
    renamed: descriptors that pass the format's checks and name what DuckDB cannot hold."""
    stream = _record_frames(draw, data)
    tables = [index for index, (head, _) in enumerate(stream or []) if b'"table"' in head]
    if not stream or not tables:
        return draw(st.sampled_from(BYTES))(draw, data, seeds)  # type: ignore[no-any-return]
    index = draw(st.sampled_from(tables))
    frame = _object(stream[index][0])
    descriptor = frame.get("table") if frame is not None else None
    if frame is None or not isinstance(descriptor, dict):
        return draw(st.sampled_from(BYTES))(draw, data, seeds)  # type: ignore[no-any-return]
    columns = [column for column in descriptor.get("columns") or [] if isinstance(column, dict)]
    action = draw(st.sampled_from(("name", "byteorder", "no columns", "repeat column", "column name")))
    if action == "name":
        descriptor["name"] = draw(st.sampled_from(TABLE_NAMES))
    elif action == "byteorder":
        descriptor["byteorder"] = "big" if descriptor.get("byteorder") == "little" else "little"
    elif action == "no columns":
        descriptor["columns"] = []
    elif columns and action == "repeat column":
        columns.append(dict(draw(st.sampled_from(columns))))
    elif columns:
        draw(st.sampled_from(columns))["name"] = draw(
            st.sampled_from(("", "a\ud83d", "A", "rowid", "x" * 300))
        )
    stream[index] = (dump_json(draw, frame), stream[index][1])
    return data[:RECORD_MAGIC_BYTES] + join_frames(stream)


RECORD_MUTATIONS = BYTES + (frames(prefix=RECORD_MAGIC_BYTES),) * 4 + (record_header, table_descriptor) * 4


@fuzzes("records", examples=150, mutations=RECORD_MUTATIONS, answer=at_most_its_own_line)
def test_record_files(folder: Path, data: bytes) -> Dict[str, Any]:
    """An input is a `.probing` file: listed, then read by backtrace, memory, hang and tables."""
    return printed(folder, written(folder, "train-4242-20260101-000000.probing", data))


# The SQL test is the slowest per input (a DuckDB session): its inputs keep the record's frames
# whole, so that most of them reach the session rather than a refusal of the format.
SQL_MUTATIONS = (frames(prefix=RECORD_MAGIC_BYTES),) * 2 + (record_header, table_descriptor) * 3


@fuzzes("records", examples=40, mutations=SQL_MUTATIONS)
def test_record_files_as_sql_reads_them(
    folder: Path, tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> List[Any]:
    """An input is a `.probing` file queried (DuckDB over its tables), as `probing FILE query`
    does, exported (`export --csv`) and made a report page (`report`: its SQL over the tables)."""
    record = open_record(written(folder, "train-4242-20260101-000000.probing", data))
    answers = []
    with contextlib.redirect_stdout(strict_stdout()):
        for sql in QUERIES:
            answer = query_record(record, sql)  # every table exists (empty unless the record holds it)
            for format in ("table", "csv", "json"):
                write_rows(answer.columns, answer.types, answer.rows, format)
            answers.append(answer.rows)
    directory = tmp_path_factory.mktemp("export")
    answers.append(export_record(record, str(directory), "csv", force=True).files)
    write_output(str(directory / "report.html"), [report_page(gather_record(record))])
    return answers


FATAL_TEXT = SCRATCH_BYTES | st.text(max_size=2000).map(lambda text: text.encode("utf-8", "surrogatepass"))


FATAL_MUTATIONS = BYTES + (text_values(),) * 4


@fuzzes("fatal", examples=120, mutations=FATAL_MUTATIONS, scratch=FATAL_TEXT, answer=at_most_its_own_line)
def test_fatal_files(folder: Path, data: bytes) -> Dict[str, Any]:
    """An input is a `.fatal` file (header line, then faulthandler's text) of a process that is
    gone: listed, then read as a record by every command."""
    return printed(folder, written(folder, "train-999999999.fatal", data))


def frames_problem(answer: Any) -> Any:
    """Each row a frame: a file and a function that are text, a line number or None."""
    _, rows = answer
    for row in rows:
        if not (isinstance(row["file"], str) and isinstance(row["func"], str)):
            return f"a frame that is not text: {str(row)[:200]}"
        if row["lineno"] is not None and not isinstance(row["lineno"], int):
            return f"a line number that is not one: {str(row)[:200]}"
    return None


@fuzzes(
    "fatal", examples=80, mutations=BYTES + (text_values(),) * 4, scratch=FATAL_TEXT, answer=frames_problem
)
def test_faulthandler_text(data: bytes) -> Any:
    """An input is faulthandler's text (after the header line), as the reader decodes it."""
    text = data.decode("utf-8", "replace")
    return parse_faulthandler(text.partition("\n")[2] if text.startswith("#probing") else text, 7)
