"""What `-o PATH` of the picture commands does to what is at PATH: a character device or a named
pipe is written into and stays what it was (root's `-o /dev/null` must not put a regular file in
/dev), a directory is refused, and a pipe nobody reads is an error at once, not a hang."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import List

import pytest

from probing.cli.render import files
from probing.errors import ProbingError, UsageError


def test_a_character_device_is_written_into_not_replaced(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root (CI runs as root)")
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # the same device as /dev/null
    files.check_output(str(null))
    assert files.write_output(str(null), ["a picture"]) == len("a picture")
    assert stat.S_ISCHR(os.stat(null).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["null"]  # no temporary left beside it


def test_a_named_pipe_is_written_into_for_its_reader(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    read: List[bytes] = []
    reader = threading.Thread(target=lambda: read.append(pipe.read_bytes()))
    reader.start()
    try:
        # the reader opens the pipe in its own time: writing may only start once it has
        for _ in range(200):
            try:
                files.write_output(str(pipe), ["one ", "picture"])
                break
            except ProbingError:
                threading.Event().wait(0.01)
    finally:
        reader.join(timeout=10)
    assert read == [b"one picture"]
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)


def test_a_named_pipe_nobody_reads_is_an_error_not_a_hang(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(ProbingError, match="no process reads the pipe"):
        files.write_output(str(pipe), ["x"])


def test_a_directory_is_refused_before_anything_is_asked(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a directory"):
        files.check_output(str(tmp_path))
    with pytest.raises(UsageError, match="is a directory"):
        files.write_output(str(tmp_path), ["x"])


def test_a_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    """A link planted where root writes its report must not lead the write to another file."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "job.html"
    link.symlink_to(victim)
    files.write_output(str(link), ["<html>"])
    assert victim.read_text() == "keep"
    assert not link.is_symlink() and link.read_text() == "<html>"
