"""What a record (or an agent's answer about one) may hold, checked before anything reads it:
frames cut short or damaged, header fields of the wrong type, known tables with columns of
another type than the schema's, a `record` reply of the wrong shape; and where a record's
backtrace looks for source lines, and how far `probing records` reads and trusts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List

import pytest
from record_files import backtrace_with_numeric_file, good_backtrace, memory_with_text_rss

from probing.client.replies import decode_reply_table
from probing.engine.records import listing as record_listing
from probing.engine.records.listing import LISTED_FATAL_BYTES, _trusted, list_records, read_header
from probing.engine.records.record import open_record, read_any
from probing.engine.records.request import check_recorded
from probing.errors import BadRecord, BadReply, ExitCode
from probing.protocol.frames import MAGIC, PREFIX
from probing.protocol.records import (
    MAX_RECORD_BYTES,
    RECORD_MAGIC,
    RecordFormatError,
    read_record,
    write_record,
)
from probing.schema.column_check import mismatched_column


def _payload(chunks: List[Any]) -> bytearray:
    return bytearray(b"".join(bytes(chunk) for chunk in chunks))


# --- frames: cut short, damaged, versions that only look right ----------------------------------


def _whole(tmp_path: Path) -> bytes:
    path = write_record(str(tmp_path), "whole.probing", {"pid": 7}, [good_backtrace()])
    return Path(path).read_bytes()


def _reason(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(RecordFormatError) as error:
        read_record(str(path))
    return str(error.value)


def test_a_record_cut_short_by_a_kill_says_so_and_a_damaged_one_says_damaged(tmp_path: Path) -> None:
    data = _whole(tmp_path)
    # The table frame's lengths pass the end of the file: the usual shape of a kill mid-write.
    assert _reason(tmp_path, "cut.probing", data[: len(data) - 40]).startswith("cut short: ")
    assert _reason(tmp_path, "prefix.probing", data[:10]).startswith("cut short: ")
    bad_magic = data[:8] + b"XXXX" + data[12:]
    assert _reason(tmp_path, "magic.probing", bad_magic) == "a damaged frame"
    huge_header = data[:8] + PREFIX.pack(MAGIC, 1 << 30, 0) + data[8 + PREFIX.size :]
    assert _reason(tmp_path, "header.probing", huge_header) == "a damaged frame"


def test_a_header_saying_record_true_is_not_version_one(tmp_path: Path) -> None:
    body = b'{"record": true}'
    content = RECORD_MAGIC + PREFIX.pack(MAGIC, len(body), 0) + body
    assert "format version True" in _reason(tmp_path, "true.probing", content)
    path = tmp_path / "true.probing"
    with pytest.raises(BadRecord, match="format version True"):
        read_header(str(path))


def test_an_end_frame_saying_true_tables_is_refused(tmp_path: Path) -> None:
    data = _whole(tmp_path)
    end = b'{"end": true}'
    # The whole record's end frame is {"end": 1}: put {"end": true} in its place.
    cut = data.rindex(MAGIC)
    content = data[:cut] + PREFIX.pack(MAGIC, len(end), 0) + end
    assert "tables but holds" in _reason(tmp_path, "end.probing", content)


def test_a_record_is_read_up_to_one_gib_unless_asked_for_more(tmp_path: Path) -> None:
    assert MAX_RECORD_BYTES == 1 << 30
    path = write_record(str(tmp_path), "a.probing", {}, [good_backtrace()])
    with pytest.raises(RecordFormatError, match="more than the 64"):
        read_record(path, max_bytes=64)
    with pytest.raises(BadRecord, match="a record may hold") as error:
        raise_with_small_limit(path)
    assert "PROBING_RECORD_READ_MAX_MB" in (error.value.hint or "")


def raise_with_small_limit(path: str) -> None:
    previous = os.environ.get("PROBING_RECORD_READ_MAX_MB")
    os.environ["PROBING_RECORD_READ_MAX_MB"] = "0"
    try:
        open_record(path)
    finally:
        if previous is None:
            os.environ.pop("PROBING_RECORD_READ_MAX_MB")
        else:
            os.environ["PROBING_RECORD_READ_MAX_MB"] = previous


# --- column types against the schema ----------------------------------------------------------


def test_the_schema_check_names_the_table_and_column() -> None:
    assert mismatched_column("python.backtrace", [("file", "VARCHAR"), ("depth", "BIGINT")]) is None
    assert mismatched_column("my.own_table", [("file", "BIGINT")]) is None  # not a known table
    assert mismatched_column("python.backtrace", [("extra", "BIGINT")]) is None  # a newer agent's
    message = mismatched_column("process.memory", [("rss_mb", "VARCHAR")])
    assert message is not None and "process.memory" in message and "'rss_mb'" in message
    assert "VARCHAR" in message and "DOUBLE" in message


@pytest.mark.parametrize(
    ("table", "column"),
    [(memory_with_text_rss, "rss_mb"), (backtrace_with_numeric_file, "file")],
    ids=["memory-rss_mb-VARCHAR", "backtrace-file-BIGINT"],
)
def test_a_record_with_a_column_of_another_type_is_a_bad_record(
    tmp_path: Path, table: Any, column: str
) -> None:
    path = write_record(str(tmp_path), "typed.probing", {"pid": 7}, [table()])
    with pytest.raises(BadRecord) as error:
        open_record(path)
    assert error.value.exit_code == ExitCode.BAD_RECORD == 15
    assert path in error.value.message and repr(column) in error.value.message


@pytest.mark.parametrize(
    ("table", "column"),
    [(memory_with_text_rss, "rss_mb"), (backtrace_with_numeric_file, "file")],
    ids=["memory-rss_mb-VARCHAR", "backtrace-file-BIGINT"],
)
def test_a_live_reply_with_a_column_of_another_type_is_a_bad_reply(table: Any, column: str) -> None:
    descriptor, chunks = table()
    with pytest.raises(BadReply) as error:
        decode_reply_table({"table": descriptor}, _payload(chunks))
    assert error.value.exit_code == ExitCode.BAD_REPLY == 13
    assert descriptor["name"] in error.value.message and repr(column) in error.value.message
    descriptor, chunks = good_backtrace()
    assert decode_reply_table({"table": descriptor}, _payload(chunks)).rows == 1


# --- `probing PID record`'s reply ------------------------------------------------------------


GOOD_ANSWER = {
    "path": "/r/a.probing",
    "bytes": 12,
    "seconds": 0.5,
    "tables": ["python.backtrace"],
    "notes": [],
}


@pytest.mark.parametrize(
    "change",
    [{"bytes": "12"}, {"bytes": -1}, {"bytes": True}, {"seconds": "abc"}, {"notes": 5}, {"notes": [1]},
     {"tables": "python.backtrace"}, {"failures": [None]}, {"path": None}],
    ids=repr,
)  # fmt: skip
def test_a_record_answer_of_the_wrong_shape_is_a_bad_reply(change: Dict[str, Any]) -> None:
    with pytest.raises(BadReply):
        check_recorded(dict(GOOD_ANSWER, **change))


def test_a_record_answer_without_optional_fields_passes() -> None:
    check_recorded(GOOD_ANSWER)
    check_recorded({"path": "/r/a.probing"})
    check_recorded(dict(GOOD_ANSWER, seconds=1, failures=["disk full"]))


# --- rendering a record's stacks ----------------------------------------------------------------


def test_a_records_backtrace_reads_no_source_under_proc_pid_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job that wrote the record is gone; its PID (1 here) may be another process's now."""
    from probing.cli.render.record import write_record_stacks
    from probing.engine import backtrace as engine_backtrace
    from probing.engine.records import stacks as engine_record
    from probing.engine.records.stacks import record_stacks

    asked: List[Any] = []

    class SpyingSourceLines(engine_backtrace.SourceLines):  # type: ignore[misc]
        def __init__(self, pid: Any, *args: Any) -> None:
            asked.append(pid)
            super().__init__(pid, *args)

    monkeypatch.setattr(engine_backtrace, "SourceLines", SpyingSourceLines)
    monkeypatch.setattr(engine_record, "SourceLines", SpyingSourceLines)
    record = open_record(write_record(str(tmp_path), "a.probing", {"pid": 1}, [good_backtrace()]))
    write_record_stacks(record, record_stacks(record, False, None), "text")
    assert asked == [None]
    assert "Process 1 (Python" in capsys.readouterr().out


# --- `probing records`: which directories, how much of each file --------------------------------


def test_a_socket_directory_named_for_a_uid_must_be_that_uids_real_directory(tmp_path: Path) -> None:
    uid = os.geteuid()
    own = tmp_path / "a" / f"probing-{uid}" / "records"
    own.mkdir(parents=True, mode=0o700)
    os.chmod(own, 0o700)
    assert _trusted(str(own))
    # Named for another user, but this one's: a user could name root's, or any.
    other = tmp_path / "b" / f"probing-{uid + 1}" / "records"
    other.mkdir(parents=True)
    os.chmod(other, 0o700)
    assert not _trusted(str(other))
    # /tmp/probing-UID a symlink to a directory of the right shape elsewhere.
    (tmp_path / "c").mkdir()
    os.symlink(own.parent, tmp_path / "c" / f"probing-{uid}")
    assert not _trusted(str(tmp_path / "c" / f"probing-{uid}" / "records"))
    if uid == 0:
        os.chown(own, 12345, -1)  # records owned by another than the directory's name says
        assert not _trusted(str(own))


def test_listing_reads_only_the_start_of_a_fatal_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = (
        "Fatal Python error: Segmentation fault\n\n"
        "Current thread 0x00007f0339650b80 (most recent call first):\n"
        '  File "/job/train.py", line 8 in crash\n'
    )
    path = tmp_path / "job-999999.fatal"
    path.write_text('#probing-fatal 1 {"pid": 999999, "argv": ["job.py"]}\n' + trace + "x" * (1 << 20))
    os.chmod(tmp_path, 0o700)
    limits: List[int] = []

    def spying_read_any(path: str, fatal_text_bytes: int = 0) -> Any:
        limits.append(fatal_text_bytes)
        return read_any(path, fatal_text_bytes)

    monkeypatch.setattr(record_listing, "read_any", spying_read_any)
    [entry] = list_records([str(tmp_path)])
    assert limits == [LISTED_FATAL_BYTES] and LISTED_FATAL_BYTES <= 64 << 10
    assert entry.kind == "fatal" and entry.reason == "fatal_signal: Segmentation fault"


def test_the_header_reader_of_the_listing_is_the_protocols(tmp_path: Path) -> None:
    path = write_record(str(tmp_path), "a.probing", {"pid": 7}, [good_backtrace()])
    header, status = read_header(path)
    assert header["pid"] == 7 and header["record"] == 1 and status.st_size == os.path.getsize(path)
    cut = tmp_path / "cut.probing"
    cut.write_bytes(Path(path).read_bytes()[:20])
    with pytest.raises(BadRecord, match="cut short"):
        read_header(str(cut))


def test_a_record_path_is_looked_at_before_it_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device whose open has effects of its own (root opening /dev/watchdog arms it) is never
    opened for reading, not even to be closed again."""
    from probing.engine.records import path as record_path

    opened: List[Any] = []
    real_open = os.open

    def spying_open(path: Any, flags: int, *args: Any) -> int:
        opened.append((str(path), flags & os.O_PATH))
        return real_open(path, flags, *args)

    monkeypatch.setattr(record_path.os, "open", spying_open)
    with pytest.raises(OSError, match="not a regular file"):
        record_path.open_regular("/dev/null")
    assert opened == [("/dev/null", os.O_PATH)]
    good = tmp_path / "a.probing"
    good.write_bytes(b"x")
    os.close(record_path.open_regular(str(good)))


def test_a_link_in_a_records_directory_is_not_listed(tmp_path: Path) -> None:
    path = write_record(str(tmp_path), "a.probing", {"pid": 7}, [good_backtrace()])
    os.symlink(path, tmp_path / "b.probing")
    os.symlink("/dev/null", tmp_path / "c.fatal")
    os.chmod(tmp_path, 0o700)
    assert [Path(entry.path).name for entry in list_records([str(tmp_path)])] == ["a.probing"]
