"""The ELF header check run before a core is handed to pystack (outside/elf_core.py), on
headers built here: what is no core, and a core cut short, are named as such."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import List, Tuple

import pytest

from probing.errors import BadRecord, UsageError
from probing.outside.elf_core import PN_XNUM, open_core_file

EHDR_SIZE, PHDR_SIZE, SHDR_SIZE = 64, 56, 64


def elf(segments: List[Tuple[int, int]], e_type: int = 4, klass: int = 2, extended: bool = False) -> bytes:
    """An ELF header, its program headers (offset, file size of each), nothing else."""
    count = len(segments)
    shoff = EHDR_SIZE + PHDR_SIZE * count if extended else 0
    header = b"\x7fELF" + bytes([klass, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", e_type, 62, 1, 0, EHDR_SIZE, shoff, 0, EHDR_SIZE, PHDR_SIZE,
                          PN_XNUM if extended else count, SHDR_SIZE, 1 if extended else 0, 0)  # fmt: skip
    table = b"".join(struct.pack("<IIQQQQQQ", 4, 0, offset, 0, 0, size, size, 0) for offset, size in segments)
    section = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, count, 0, 0) if extended else b""
    return header + table + section


def check_core_file(path: str) -> int:
    """The size of the core at `path`, once open_core_file has checked it."""
    with open_core_file(path) as core:
        assert core.descriptor >= 0
        return core.status.st_size


def written(tmp_path: Path, content: bytes, size: int = 0) -> str:
    path = tmp_path / "core"
    path.write_bytes(content.ljust(size, b"\0"))
    return str(path)


def test_a_whole_core_passes(tmp_path: Path) -> None:
    assert check_core_file(written(tmp_path, elf([(4096, 100)]), 4196)) == 4196


def test_a_core_with_more_headers_than_e_phnum_holds_passes(tmp_path: Path) -> None:
    content = elf([(4096, 100)], extended=True)
    assert check_core_file(written(tmp_path, content, 4196)) == 4196


def test_a_core_cut_short_says_how_much_is_missing(tmp_path: Path) -> None:
    with pytest.raises(BadRecord, match="cut short: 3000 bytes of the 4196 its headers describe"):
        check_core_file(written(tmp_path, elf([(4096, 100)]), 3000))


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "no ELF header"),
        (b"#!/bin/sh\n" * 10, "no ELF header"),
        (elf([], e_type=2), "is an executable, not a core file"),
        (elf([], e_type=3), "a shared library or executable, not a core file"),
        (elf([], klass=1), "not a 64-bit little-endian ELF file"),
    ],
)
def test_files_that_are_no_core(tmp_path: Path, content: bytes, words: str) -> None:
    with pytest.raises(BadRecord, match=words):
        check_core_file(written(tmp_path, content))


def test_a_missing_file_or_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        check_core_file(str(tmp_path / "nothing"))
    with pytest.raises(UsageError, match="is a directory"):
        check_core_file(str(tmp_path))


def test_a_fifo_in_the_place_of_a_core_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "core"
    os.mkfifo(fifo)
    with pytest.raises(BadRecord, match="is not a regular file"):
        check_core_file(str(fifo))
