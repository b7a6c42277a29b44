"""How the core reader's process is started and read (outside/core_process.py), with a stand-in
reader: the core on descriptor 3, a session of its own, stdin on /dev/null, its output capped
(killed past the cap, not buffered), its time limited; and what it is told to confine itself to."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from probing.outside import core_process
from probing.outside.core_process import confinement_arguments, run_reader
from probing.outside.elf_core import CoreFile
from probing.outside.spawn import TimedOut, TooMuchOutput

SAYS_WHERE_IT_RUNS = """
import json, os
print(json.dumps({
    "core": os.read(3, 100).decode(),
    "session_leader": os.getsid(0) == os.getpid(),
    "stdin": os.readlink("/proc/self/fd/0"),
}))
"""


def core_file(tmp_path: Path, content: bytes = b"the core") -> CoreFile:
    path = tmp_path / "core"
    path.write_bytes(content)
    return CoreFile(str(path), os.open(path, os.O_RDONLY | os.O_CLOEXEC), path.stat())


def reader(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_reader_gets_the_core_on_descriptor_3_in_a_session_of_its_own(tmp_path: Path) -> None:
    with core_file(tmp_path) as core:
        status, out, err = run_reader(reader(SAYS_WHERE_IT_RUNS), core, 10, 1000)
        assert core.descriptor >= 0  # still the caller's to close
    assert (status, err) == (0, b"")
    assert json.loads(out) == {"core": "the core", "session_leader": True, "stdin": os.devnull}


def test_a_reader_printing_past_its_cap_is_killed_at_once(tmp_path: Path) -> None:
    code = "import sys, time; sys.stdout.write('x' * 5000); sys.stdout.flush(); time.sleep(30)"
    started = time.monotonic()
    with core_file(tmp_path) as core, pytest.raises(TooMuchOutput) as raised:
        run_reader(reader(code), core, 20, 4096)
    assert (raised.value.stream, raised.value.cap) == ("stdout", 4096)
    assert time.monotonic() - started < 10


def test_stderr_has_a_cap_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_process, "MAX_STDERR_BYTES", 1000)
    code = "import sys, time; sys.stderr.write('e' * 2000); sys.stderr.flush(); time.sleep(30)"
    with core_file(tmp_path) as core, pytest.raises(TooMuchOutput, match="stderr"):
        run_reader(reader(code), core, 20, 4096)


def test_output_up_to_the_cap_is_read_whole(tmp_path: Path) -> None:
    with core_file(tmp_path) as core:
        status, out, _ = run_reader(reader("print('x' * 99_999)"), core, 10, 100_000)
    assert status == 0 and len(out) == 100_000


def test_a_reader_past_its_time_is_killed(tmp_path: Path) -> None:
    started = time.monotonic()
    with core_file(tmp_path) as core, pytest.raises(TimedOut):
        run_reader(reader("import time; time.sleep(30)"), core, 0.3, 1000)
    assert time.monotonic() - started < 5


def test_root_reads_another_users_core_as_that_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with core_file(tmp_path, b"x" * 1000) as core:
        core.status = os.stat_result((0o100600, 0, 0, 1, 1000, 1001, 1 << 40, 0, 0, 0))
        monkeypatch.setattr(os, "geteuid", lambda: 0)
        assert confinement_arguments(core) == ["--memory", str(4 << 40), "--run-as", "1000:1001"]
        core.status = os.stat_result((0o100600, 0, 0, 1, 0, 0, 1000, 0, 0, 0))
        assert confinement_arguments(core) == ["--memory", str(2 << 30)]  # root's own core
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
        core.status = os.stat_result((0o100600, 0, 0, 1, 1000, 1001, 1000, 0, 0, 0))
        assert confinement_arguments(core) == ["--memory", str(2 << 30)]  # a user's own
