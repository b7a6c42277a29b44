"""`probing FILE export` writes what may be secrets (locals, argv, exception text): only its owner
may read what it writes, and no write goes through an entry planted at a final name."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Iterator

import pytest
from record_files import good_backtrace

from probing.engine.records.record import Record, open_record
from probing.engine.records.sql import HEADER_FILE, export_record
from probing.errors import ProbingError
from probing.protocol.records import write_record

pytest.importorskip("duckdb")


@pytest.fixture
def record(tmp_path: Path) -> Record:
    header = {"pid": 7, "argv": ["train.py", "--token", "secret"], "written_at": 1.0}
    return open_record(write_record(str(tmp_path), "a.probing", header, [good_backtrace()]))


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The umask most users have: what is created is readable by everyone unless made otherwise."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("format", ["parquet", "csv"])
def test_export_makes_a_private_directory_of_private_files(
    record: Record, tmp_path: Path, open_umask: None, format: str
) -> None:
    out = tmp_path / "out"
    exported = export_record(record, str(out), format, force=False)
    assert _mode(out) == 0o700
    names = sorted(os.listdir(out))
    assert names == sorted([f"python.backtrace.{format}", HEADER_FILE])  # no temporary left
    for name in names:
        assert _mode(out / name) == 0o600, name
    written = [f"python.backtrace.{format}", HEADER_FILE]
    assert [entry["bytes"] for entry in exported.files] == [os.path.getsize(out / name) for name in written]
    assert '"secret"' in (out / HEADER_FILE).read_text()


def test_export_into_a_directory_that_exists_keeps_its_mode_and_still_writes_0600(
    record: Record, tmp_path: Path, open_umask: None
) -> None:
    out = tmp_path / "shared"
    out.mkdir(mode=0o755)
    export_record(record, str(out), "csv", force=False)
    assert _mode(out) == 0o755
    assert all(_mode(out / name) == 0o600 for name in os.listdir(out))


def test_force_replaces_a_planted_symlink_and_never_writes_through_it(record: Record, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    os.symlink(victim, out / "python.backtrace.parquet")
    os.symlink(victim, out / HEADER_FILE)
    with pytest.raises(ProbingError, match="exists"):
        export_record(record, str(out), "parquet", force=False)
    export_record(record, str(out), "parquet", force=True)
    assert victim.read_text() == "keep me\n"
    assert not os.path.islink(out / "python.backtrace.parquet") and not os.path.islink(out / HEADER_FILE)
    assert _mode(out / HEADER_FILE) == 0o600


def test_force_replaces_a_fifo_instead_of_blocking_on_it(record: Record, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "python.backtrace.csv")
    os.mkfifo(out / HEADER_FILE)
    failure: list = []  # type: ignore[type-arg]

    def export() -> None:
        try:
            export_record(record, str(out), "csv", force=True)
        except BaseException as error:  # noqa: B036 - reported by the test, not lost in the thread
            failure.append(error)

    # A thread so that a regression (an open of the FIFO) fails the test instead of hanging it.
    worker = threading.Thread(target=export, daemon=True)
    worker.start()
    worker.join(timeout=30)
    if worker.is_alive():
        for name in ("python.backtrace.csv", HEADER_FILE):  # let a blocked open return
            path = out / name
            if stat.S_ISFIFO(os.lstat(path).st_mode):
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        pytest.fail("export opened a FIFO in the way")
    assert not failure, failure
    assert stat.S_ISREG(os.lstat(out / "python.backtrace.csv").st_mode)
    assert (out / "python.backtrace.csv").read_text().startswith("pid,thread_id,")  # the schema's order


def test_a_directory_in_the_way_is_an_error_and_leaves_no_temporary(record: Record, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "python.backtrace.csv").mkdir(parents=True)
    with pytest.raises(ProbingError, match="cannot write"):
        export_record(record, str(out), "csv", force=True)
    assert sorted(os.listdir(out)) == ["python.backtrace.csv"]
