"""engine/sources.py: the job names the files whose lines the CLI reads, and may name anything."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from probing.engine import sources
from probing.engine.sources import SourceLines


def test_lines_of_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "job.py"
    path.write_bytes(b"a = 1\n  b = 2  \n\xff\n")
    lines = SourceLines(None, reader=None)
    assert [lines.line(str(path), n) for n in (1, 2, 3, 4, 0)] == ["a = 1", "b = 2", "\ufffd", "", ""]


def test_what_is_not_a_regular_file_has_no_lines(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    # A FIFO nobody writes to would hold a blocking open() forever: the reader must not wait.
    done = threading.Event()
    got = []

    def read() -> None:
        lines = SourceLines(None, reader=None)
        got.extend(lines.line(path, 1) for path in (str(fifo), "/dev/zero", str(tmp_path), "/nonexistent"))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(10), "reading a FIFO's or a device's lines blocked"
    assert got == ["", "", "", ""]


def test_a_file_too_big_has_no_lines(tmp_path: Path) -> None:
    path = tmp_path / "big.py"
    path.write_bytes(b"x = 1\n" * 100)
    sources.MAX_SOURCE_BYTES = 50
    try:
        assert SourceLines(None, reader=None).line(str(path), 1) == ""
    finally:
        sources.MAX_SOURCE_BYTES = 64 << 20


def test_a_fifo_is_looked_at_not_opened(tmp_path: Path) -> None:
    """O_PATH: what the path is, seen without an open (a device's open may act: /dev/watchdog
    arms). A writer waiting in open() on a FIFO wakes when any reader opens it; it waits on."""
    fifo = tmp_path / "job.py"
    os.mkfifo(fifo)
    opened = threading.Event()

    def write() -> None:
        os.close(os.open(fifo, os.O_WRONLY))
        opened.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    calls = Path(f"/proc/self/task/{writer.native_id}/syscall")
    try:
        # In open() (openat, x86_64 257 or aarch64 56) before the read, or the test proves nothing.
        deadline = time.monotonic() + 10
        while calls.read_text().split()[0] not in ("257", "56") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert SourceLines(None, reader=None).line(str(fifo), 1) == ""
        assert not opened.is_set()
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(10)


def test_proc_files_are_regular_files_that_read() -> None:
    """/proc files say size 0; reopened through /proc/self/fd they read whole."""
    status = sources._read_regular_file("/proc/self/status")
    assert status is not None and b"\nPid:" in status


def test_root_reads_a_jobs_files_only_as_the_jobs_user_could(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As root, for a job of another user, or one whose user cannot be told (a TCP target, a
    PID that is gone), only files that user could read show lines (sources.py's docstring)."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert sources.reader_for_process(None) == sources.NOBODY
    assert sources.reader_for_process(2**22 + 12345) == sources.NOBODY  # no such process
    assert sources.reader_for_owner(0, 0) is None
    assert sources.reader_for_owner(1000, 1000) == sources.Reader(1000, frozenset([1000]))
    private = tmp_path / "private.py"
    private.write_text("secret = 1\n")
    private.chmod(0o600)
    assert SourceLines(None).line(str(private), 1) == ""  # nobody's: not even its directory
    assert SourceLines(None, reader=None).line(str(private), 1) == "secret = 1"
