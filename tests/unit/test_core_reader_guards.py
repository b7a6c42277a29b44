"""The guards of the core reader itself (outside/core_reader.py): paths named in a core are
opened only when they are regular files, what it prints is budgeted in the bytes json.dump
writes, and it confines itself (checked in a process of its own, in /proc/self/status)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List, Tuple

import pytest

from probing.outside import core_reader
from probing.outside.core_reader import Budget, is_elf, thread_document


def test_only_a_regular_file_is_opened_for_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    elf = tmp_path / "elf"
    elf.write_bytes(b"\x7fELF" + bytes(60))
    opened: List[Tuple[str, int]] = []
    real_open = os.open

    def recording_open(path: Any, flags: int, *args: Any) -> int:
        opened.append((str(path), flags))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", recording_open)
    for path in (str(fifo), "/dev/zero", "/dev/null", str(tmp_path), str(tmp_path / "missing")):
        assert not is_elf(path)
    assert all(flags & os.O_PATH for _, flags in opened), opened  # nothing but O_PATH
    assert is_elf(str(elf)) and not is_elf(__file__)
    reopened = [flags for path, flags in opened if path.startswith("/proc/self/fd/")]
    assert reopened and all(flags & os.O_NONBLOCK and flags & os.O_NOCTTY for flags in reopened)


def fake_thread(frames: int, value: str) -> SimpleNamespace:
    def frame(index: int) -> SimpleNamespace:
        code = SimpleNamespace(filename=f"/job/f{index}.py", scope="step", location=SimpleNamespace(lineno=1))
        return SimpleNamespace(code=code, arguments={"batch": value}, locals={})

    return SimpleNamespace(tid=7, name=None, holds_the_gil=0, python_version=(3, 11),
                           frames=[frame(index) for index in range(frames)])  # fmt: skip


def test_the_budget_counts_the_bytes_that_are_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-ASCII repr is printed as \\uXXXX escapes: six bytes a character, not one."""
    monkeypatch.setattr(core_reader, "MAX_OUTPUT", 100_000)
    for value in ("a" * 300, "é" * 300, "😀" * 150):
        budget = Budget()
        document = thread_document(fake_thread(10_000, value), True, budget)
        printed = len(json.dumps(document))
        assert budget.spent() and len(document["frames"]) < 10_000
        assert 90_000 <= printed <= 100_000 + 1000, (value[0], printed)


CONFINES_ITSELF = """
import sys
sys.path.insert(0, sys.argv[1])
import core_reader
core_reader.become((65534, 65534))
print(open("/proc/self/status").read())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can become another user")
def test_the_reader_drops_to_the_owner_for_good_and_gains_no_privileges() -> None:
    directory = os.path.dirname(core_reader.__file__)
    result = subprocess.run(
        [sys.executable, "-I", "-c", CONFINES_ITSELF, directory], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    status = dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)
    assert status["Uid"].split() == ["65534"] * 4 and status["Gid"].split() == ["65534"] * 4
    assert status["Groups"].split() == [] and status["NoNewPrivs"].strip() == "1"


ALLOCATES = """
import sys
sys.path.insert(0, sys.argv[1])
import core_reader
core_reader.limit(256 << 20)
try:
    bytearray(512 << 20)
except MemoryError:
    print("refused")
"""


def test_what_the_reader_may_allocate_is_bounded() -> None:
    directory = os.path.dirname(core_reader.__file__)
    result = subprocess.run(
        [sys.executable, "-I", "-c", ALLOCATES, directory], capture_output=True, text=True, timeout=30
    )
    assert (result.returncode, result.stdout) == (0, "refused\n"), result.stderr


def test_arguments_it_cannot_parse_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for arguments in (
        ["core", "--run-as", "65534"],
        ["core", "--run-as", "a:b"],
        ["core", "--memory", "x"],
    ):
        assert core_reader.main(arguments) == 2
    assert "usage: core_reader.py" in capsys.readouterr().err
