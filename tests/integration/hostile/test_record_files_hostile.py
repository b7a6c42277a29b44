"""Records are other users' files, read by root: what one holds must cost at most its own line
in `probing records` and a clear exit code when it is the target, never a traceback. Each file
here is one a job could write (every check of the format passes): times that are no time, text
that is not UTF-8, tables DuckDB cannot hold, a table byte-swapped, too many tables, and the
temporary file a killed write leaves.
"""

from __future__ import annotations

import array
import json
import os
import random
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import pytest
from record_files import header

from probing.protocol.records import write_record
from probing.protocol.tables import ColumnBuffers, encode_table
from probing.schema.tables import AGENT_TABLES

from support import probing

NOBODY = 65534
HALF_EMOJI = json.loads('"caf\\ud83d"')  # what json.loads leaves of a broken emoji
ESCAPED = "caf\\ud83d"
# The stream error handlers the CLI's stdout may have (PYTHONIOENCODING sets it).
STDOUTS = [{"PYTHONIOENCODING": "utf-8"}, {"PYTHONIOENCODING": "utf-8:surrogateescape"}]
Frame = Tuple[Dict[str, Any], List[Any]]


def records_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "records"
    directory.mkdir(mode=0o700)
    return directory


def record(directory: Path, name: str, tables: Sequence[Frame] = (), **fields: Any) -> str:
    """A record as an agent of user nobody would write it, its header fields replaced by `fields`."""
    head = header(4242, ["train.py"], {"kind": "exception", "message": "boom"})
    head.update(fields)
    path = write_record(str(directory), name, head, list(tables))
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
    return path


def fatal_file(directory: Path, name: str, **fields: Any) -> str:
    head = header(1, ["train.py"], {"kind": "fatal_signal"})
    head.update(fields)
    path = directory / name
    path.write_text("#probing-fatal 1 " + json.dumps(head) + "\n")
    return str(path)


def doubles(values: Sequence[float]) -> bytes:
    return array.array("d", values).tobytes()


def ints(values: Sequence[int]) -> bytes:
    return array.array("q", values).tobytes()


def one_column(name: str, rows: int = 1) -> Frame:
    descriptor, chunks = encode_table(
        name, rows, [ColumnBuffers("a", "BIGINT", ints(range(rows)), None, None)]
    )
    return descriptor, chunks


# --- item 5: another user's record must not hide every record ------------------------------------


@pytest.fixture
def listed(tmp_path: Path) -> Path:
    directory = records_dir(tmp_path)
    record(directory, "good-1-20260101-000000.probing")
    record(directory, "far-2-20260101-000000.probing", written_at=1e30)
    record(directory, "nan-3-20260101-000000.probing", written_at=float("nan"))
    record(directory, "argv-4-20260101-000000.probing", argv=["train.py", HALF_EMOJI, "\udcff"])
    exception = {"type": "ValueError", "message": HALF_EMOJI, "thread": "MainThread", "frames": [],
                 "text": f"Traceback (most recent call last):\nValueError: {HALF_EMOJI}\n"}  # fmt: skip
    reason = {"kind": "exception", "message": f"ValueError: {HALF_EMOJI}", "signal": None, "exit_status": 1}
    record(directory, "exc-5-20260101-000000.probing", reason=reason, exception=exception)
    # PID 1 runs: the listing asks whether this is its armed fault handler, by its start time.
    fatal_file(directory, "huge-1.fatal", started_at=10**400)
    return directory


@pytest.mark.parametrize("stdout", STDOUTS, ids=["strict", "surrogateescape"])
def test_a_bad_record_costs_only_its_own_line_in_the_listing(listed: Path, stdout: Dict[str, str]) -> None:
    result = probing("records", "--dir", str(listed), env=stdout)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    lines = {line.split()[-1].rsplit("/", 1)[-1]: line for line in result.stdout.splitlines()[2:]}
    assert sorted(lines) == sorted(os.listdir(listed)), result.stdout
    assert "unreadable: " in lines["far-2-20260101-000000.probing"]
    assert "written_at (1e+30) is not a time" in lines["far-2-20260101-000000.probing"]
    assert "written_at (nan) is not a time" in lines["nan-3-20260101-000000.probing"]
    assert "started_at" in lines["huge-1.fatal"] and "unreadable: " in lines["huge-1.fatal"]
    assert f"train.py {ESCAPED} \\udcff" in lines["argv-4-20260101-000000.probing"]
    assert f"ValueError: {ESCAPED}" in lines["exc-5-20260101-000000.probing"]
    assert "exception: boom" in lines["good-1-20260101-000000.probing"]


def test_the_listing_as_json_names_each_bad_record(listed: Path) -> None:
    result = probing("records", "--dir", str(listed), "--format", "json")
    assert result.returncode == 0, result.stderr
    entries = {os.path.basename(entry["path"]): entry for entry in json.loads(result.stdout)}
    assert entries["far-2-20260101-000000.probing"]["kind"] == "unreadable"
    assert entries["argv-4-20260101-000000.probing"]["argv"] == ["train.py", HALF_EMOJI, "\udcff"]


@pytest.mark.parametrize("stdout", STDOUTS, ids=["strict", "surrogateescape"])
def test_a_record_with_lone_surrogates_reads_as_their_escapes(listed: Path, stdout: Dict[str, str]) -> None:
    shown = probing(str(listed / "argv-4-20260101-000000.probing"), "backtrace", env=stdout)
    assert shown.returncode == 0, shown.stderr
    assert f"train.py {ESCAPED} \\udcff" in shown.stdout
    failed = probing(str(listed / "exc-5-20260101-000000.probing"), "backtrace", env=stdout)
    assert failed.returncode == 0, failed.stderr
    assert f"because of an uncaught exception (exit status 1): ValueError: {ESCAPED}" in failed.stdout
    assert f"\nValueError: {ESCAPED}\n" in failed.stdout


def test_a_record_whose_time_is_no_time_is_refused_by_name(listed: Path) -> None:
    for name, shown in (("far-2-20260101-000000.probing", "1e+30"), ("nan-3-20260101-000000.probing", "nan")):
        result = probing(str(listed / name), "backtrace")
        assert result.returncode == 15, result.stderr
        assert f"its header's written_at ({shown}) is not a time" in result.stderr
        assert "Traceback" not in result.stderr


# --- item 7: record contents that DuckDB cannot hold -------------------------------------------


def test_tables_duckdb_cannot_hold_are_left_out_with_a_note(tmp_path: Path) -> None:
    directory = records_dir(tmp_path)
    no_columns = encode_table("extra.empty", 3, [])
    path = record(directory, "names.probing", [
        no_columns, one_column("pg_catalog.pg_class"), one_column("information_schema.tables"),
        one_column("temp.y"), one_column("Main.x"), one_column("extra.kept", 2), one_column("EXTRA.KEPT"),
    ])  # fmt: skip
    for args in (
        ("query", "SELECT sum(a) AS total FROM extra.kept"), ("tables",), ("memory",), ("backtrace",),
        ("export", "--parquet", str(tmp_path / "out")), ("report", "-o", str(tmp_path / "page.html")),
    ):  # fmt: skip
        result = probing(path, *args)
        assert result.returncode == 0, (args, result.stderr)
        assert "Traceback" not in result.stderr, args
    query = probing(path, "query", "SELECT sum(a) AS total FROM extra.kept", "--format", "json")
    assert json.loads(query.stdout) == [{"total": 1}]
    notes = probing(path, "backtrace").stdout
    assert "a table named 'extra.empty' was left out: it has no columns" in notes
    assert "'pg_catalog.pg_class' was left out: pg_catalog is a schema of DuckDB's own" in notes
    assert "'information_schema.tables' was left out" in notes and "'temp.y' was left out" in notes
    assert "'EXTRA.KEPT' was left out: a second table of that name" in notes
    assert sorted(os.listdir(tmp_path / "out")) == ["extra.kept.parquet", "record.json"]


def memory_table(rows: int) -> Frame:
    """process.memory with every column of the schema, sampled once a second until now."""
    rng = random.Random(7)
    now = time.time()
    columns = []
    for column in AGENT_TABLES["process.memory"].columns:
        if column.type == "TIMESTAMP":
            columns.append(
                ColumnBuffers(
                    column.name,
                    "TIMESTAMP",
                    doubles([now - rows + i + rng.random() for i in range(rows)]),
                    None,
                    None,
                )
            )  # noqa: E501
        elif column.type == "DOUBLE":
            columns.append(
                ColumnBuffers(
                    column.name, "DOUBLE", doubles([100 + 50 * rng.random() for _ in range(rows)]), None, None
                )
            )  # noqa: E501
        else:
            columns.append(
                ColumnBuffers(
                    column.name, column.type, ints([rng.randrange(1, 99) for _ in range(rows)]), None, None
                )
            )  # noqa: E501
    descriptor, chunks = encode_table("process.memory", rows, columns)
    return descriptor, chunks


def test_a_byte_swapped_memory_table_reads_as_values_that_are_no_time(tmp_path: Path) -> None:
    """A record written on one machine, its descriptor saying the other byte order (or a hostile
    one): every timestamp is 1e294 or 1e-300, every MB figure absurd. The commands answer."""
    descriptor, chunks = memory_table(50)
    swapped = dict(descriptor, byteorder="big" if descriptor["byteorder"] == "little" else "little")
    path = record(records_dir(tmp_path), "swapped.probing", [(swapped, chunks)])
    for args in (("memory",), ("memory", "--format", "json"), ("report", "-o", str(tmp_path / "page.html"))):
        result = probing(path, *args)
        assert result.returncode == 0, (args, result.stderr)
        assert "Traceback" not in result.stderr, args
    times = probing(path, "query", "SELECT count(ts) AS times, count(*) AS samples FROM process.memory",
                    "--format", "json")  # fmt: skip
    assert times.returncode == 0, times.stderr
    counted = json.loads(times.stdout)[0]
    assert counted["samples"] == 50 and counted["times"] < 50  # a time that is no time is NULL


# --- item 8: a record of many tables ---------------------------------------------------------------


def many_tables(directory: Path, name: str, count: int, rows: int) -> str:
    return record(directory, name, [one_column(f"extra.t{index}", rows) for index in range(count)])


def test_a_record_of_more_tables_than_the_bound_is_refused(tmp_path: Path) -> None:
    path = many_tables(records_dir(tmp_path), "many.probing", 20000, 0)
    started = time.monotonic()
    result = probing(path, "tables", timeout=120)
    assert result.returncode == 15, result.stderr
    assert "20000 tables, more than the 256 a record may hold" in result.stderr
    assert time.monotonic() - started < 60


def test_a_record_at_the_bound_is_read_whole(tmp_path: Path) -> None:
    path = many_tables(records_dir(tmp_path), "bound.probing", 256, 1)
    sql = "SELECT count(*) AS tables FROM information_schema.tables WHERE table_schema = 'extra'"
    result = probing(path, "query", sql, "--format", "json", timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"tables": 256}]


# --- item 9: the temporary file of a write cut short ------------------------------------------------


def test_the_empty_temporary_file_of_a_killed_write_exits_15(tmp_path: Path) -> None:
    """SIGKILL (or a full disk) before the first byte: `.NAME.probing.PID.tmp`, empty."""
    path = records_dir(tmp_path) / ".train-4242-20260101-000000.probing.4242.tmp"
    path.write_bytes(b"")
    result = probing(str(path), "backtrace")
    assert result.returncode == 15, result.stderr
    assert "a record whose write was cut short" in result.stderr
