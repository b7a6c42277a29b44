"""engine/sources.py: the job names the files whose lines the CLI reads, and may name anything."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from probing.engine import sources
from probing.engine.sources import SourceLines


def test_lines_of_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "job.py"
    path.write_bytes(b"a = 1\n  b = 2  \n\xff\n")
    lines = SourceLines(None)
    assert [lines.line(str(path), n) for n in (1, 2, 3, 4, 0)] == ["a = 1", "b = 2", "\ufffd", "", ""]


def test_what_is_not_a_regular_file_has_no_lines(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    # A FIFO nobody writes to would hold a blocking open() forever: the reader must not wait.
    done = threading.Event()
    got = []

    def read() -> None:
        lines = SourceLines(None)
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
        assert SourceLines(None).line(str(path), 1) == ""
    finally:
        sources.MAX_SOURCE_BYTES = 64 << 20
