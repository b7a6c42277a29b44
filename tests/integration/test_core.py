"""`probing core CORE`: the Python stacks of a real core file, written by the kernel when a
target crashes (`ulimit -c`) or by gcore from a live target, and clear errors (exit 15) for
files that are no Python core."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tools import need

from support import (
    INTERPRETER_PATTERNS,
    TARGETS,
    Target,
    find_interpreter,
    interpreter_params,
    probing,
    wait_until,
)

CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")
BAD_RECORD = 15
DEPTH_ZERO = "SELECT func, file, lineno FROM python.backtrace WHERE depth = 0"


def kernel_writes_cores_here() -> None:
    """Skip, saying why, when the kernel's cores do not land in the crashing process's working
    directory (core_pattern pipes them to a handler such as systemd-coredump or apport, or names
    another directory): this test must not change a machine-wide setting to get one."""
    pattern = CORE_PATTERN.read_text().strip()
    if pattern.startswith("|"):
        pytest.skip(f"core_pattern pipes cores to {pattern[1:].split()[0]}: no core file lands here")
    if "/" in pattern:
        pytest.skip(f"core_pattern writes cores to {pattern}, outside the test's directory")


def crash_with_core(argv: List[str], directory: Path, timeout: float = 60) -> Path:
    """Run `argv` in `directory` with cores allowed (`ulimit -c` raised to its hard limit) until
    the kernel kills it with SIGSEGV; the core file it wrote there."""
    kernel_writes_cores_here()
    script = 'ulimit -c "$(ulimit -H -c)" && exec "$@"'
    result = subprocess.run(
        ["sh", "-c", script, "sh", *argv], cwd=directory, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == -signal.SIGSEGV, result.stderr
    return written_core(directory)


def written_core(directory: Path) -> Path:
    prefix = CORE_PATTERN.read_text().strip().split("%")[0] or "core"
    cores = [path for path in directory.iterdir() if path.name.startswith(prefix)]
    if not cores:
        limit = subprocess.run(["sh", "-c", "ulimit -H -c"], capture_output=True, text=True).stdout.strip()
        pytest.skip(f"the kernel wrote no core (hard limit of ulimit -c: {limit})")
    return cores[0]


def gcore(pid: int, directory: Path) -> Path:
    need("gdb")  # gcore is gdb's
    result = subprocess.run(
        ["gcore", "-o", str(directory / "gcore"), str(pid)], capture_output=True, text=True, timeout=120
    )
    core = directory / f"gcore.{pid}"
    assert result.returncode == 0 and core.exists(), result.stdout + result.stderr
    return core


def rows_of(result: Any) -> List[Dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    rows: List[Dict[str, Any]] = json.loads(result.stdout)
    return rows


@pytest.fixture(scope="module")
def crash_core(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One core of segfaults.py written by the kernel, shared by the tests that only read it."""
    directory = tmp_path_factory.mktemp("crash")
    return crash_with_core([sys.executable, str(TARGETS / "segfaults.py")], directory)


@pytest.mark.parametrize("python", interpreter_params())
def test_a_kernel_core_shows_the_python_frame_that_crashed(python: str, tmp_path: Path) -> None:
    core = crash_with_core([python, str(TARGETS / "segfaults.py")], tmp_path)
    text = probing("core", str(core))
    assert text.returncode == 0, text.stderr
    assert f"Core file {core}: ended by SIGSEGV at address 0x0" in text.stdout
    assert '"MainThread", main thread: holds the GIL' in text.stdout
    main = text.stdout.split('"MainThread"')[1].split("\nThread ")[0]
    assert main.index("in train") < main.index("in read_null") < main.index("in string_at")
    assert "read_null(step)" in main  # the source line, as a traceback shows it
    # ... also of the interpreter's own library, read as the core's owner (root's core: anything),
    # not as nobody (a root-only /root/.pyenv showed no line there).
    assert "return _string_at(ptr, size)" in main
    assert "in wait_for_stop" in text.stdout.split('"MainThread"')[0] + text.stdout.split(main)[-1]

    rows = rows_of(probing("core", str(core), "--format", "json"))
    assert {row["source"] for row in rows} == {"pystack"}
    main_rows = sorted((row for row in rows if row["is_main"]), key=lambda row: row["depth"])
    python_frames = [row["func"] for row in main_rows]
    assert python_frames[:3] == ["string_at", "read_null", "train"]
    assert main_rows[1]["file"] == str(TARGETS / "segfaults.py") and main_rows[1]["lineno"] == 12
    helper = [row for row in rows if not row["is_main"]]
    assert any(row["func"] == "wait_for_stop" for row in helper)


def test_the_modes_docs_core_files_md_gives_a_core_are_its_writers(crash_core: Path, tmp_path: Path) -> None:
    """The kernel writes a core 0600; gcore with the umask's mode (docs/core-files.md said 0600 for both)."""
    assert stat.S_IMODE(crash_core.stat().st_mode) == 0o600
    umask = os.umask(0)
    os.umask(umask)
    with Target("waiters.py", via="plain") as job:
        core = gcore(job.pid, tmp_path)
    assert stat.S_IMODE(core.stat().st_mode) == 0o666 & ~umask


def test_sql_runs_over_a_core(crash_core: Path) -> None:
    rows = rows_of(probing("core", str(crash_core), "query", DEPTH_ZERO, "--format", "json"))
    assert {"func": "string_at", "file": rows[0]["file"], "lineno": rows[0]["lineno"]} in rows
    assert rows[0]["file"].endswith("ctypes/__init__.py")
    assert {row["func"] for row in rows} == {"string_at", "wait"}
    table = probing(
        "core", str(crash_core), "query", "SELECT count(DISTINCT native_id) AS threads FROM backtrace"
    )
    assert table.returncode == 0, table.stderr
    assert table.stdout.split()[-1] == "2"


def test_a_core_file_is_a_target_like_any_other(crash_core: Path) -> None:
    """`probing CORE backtrace | query | tables` answer as `probing core CORE` does; what a core
    cannot answer exits 16 and says what to run instead, with no traceback."""
    core = str(crash_core)
    assert probing(core, "backtrace").stdout == probing("core", core).stdout != ""
    assert rows_of(probing(core, "query", DEPTH_ZERO, "--format", "json")) == rows_of(
        probing("core", core, "query", DEPTH_ZERO, "--format", "json")
    )
    assert rows_of(probing(core, "backtrace", "--format", "json")) == rows_of(
        probing("core", core, "--format", "json")
    )
    tables = probing(core, "tables", "--format", "json")
    assert [table["name"] for table in json.loads(tables.stdout)] == ["python.backtrace"], tables.stderr
    live = [["eval", "1"], ["hang"], ["memory"], ["trace", "on"], ["report", "-o", os.devnull]]
    for command in [*live, ["backtrace", "--ranks", "all"], ["backtrace", "--native"]]:
        result = probing(core, *command)
        assert result.returncode == 16, (command, result.stderr)
        assert f"{core} is a core file" in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert "a core answers backtrace, query over python.backtrace and tables" in result.stderr


def test_a_query_over_a_table_a_core_lacks_says_so(crash_core: Path) -> None:
    result = probing("core", str(crash_core), "query", "SELECT * FROM python.torch_trace")
    assert result.returncode == 16, result.stderr
    assert "a core file holds python.backtrace only; python.torch_trace needs a live process" in result.stderr


def test_a_gcore_of_a_live_target_shows_every_thread(tmp_path: Path) -> None:
    """py-spy cannot read a core gcore wrote ("Failed to get binary from coredump"); pystack can."""
    with Target("waiters.py", via="plain") as job:
        core = gcore(job.pid, tmp_path)
        assert job.alive()  # gcore copies the process and lets it go on
    text = probing("core", str(core))
    assert text.returncode == 0, text.stderr
    assert "a live process, stopped to be copied (gcore or a debugger wrote it)" in text.stdout
    assert '"MainThread", main thread: reading standard input' in text.stdout
    rows = rows_of(probing("core", str(core), "--format", "json", "--locals"))
    functions = {row["func"] for row in rows}
    assert {"serve", "load_batches", "save_checkpoints", "send_heartbeats"} <= functions
    assert len({row["native_id"] for row in rows}) == 4
    loader = next(row for row in rows if row["func"] == "load_batches")
    assert loader["locals"]["batch"] == "7"  # the JSON column, as JSON
    only = rows_of(probing("core", str(core), "--format", "json", "--thread", str(job.pid)))
    assert {row["thread_name"] for row in only} == {"MainThread"}


def test_a_core_of_a_program_that_is_not_python_is_refused(tmp_path: Path) -> None:
    kernel_writes_cores_here()
    sleeper = subprocess.Popen(["sh", "-c", 'ulimit -c "$(ulimit -H -c)" && exec sleep 600'], cwd=tmp_path)
    try:
        assert wait_until(lambda: os.path.realpath(f"/proc/{sleeper.pid}/exe").endswith("/sleep"))
        os.kill(sleeper.pid, signal.SIGSEGV)
        assert sleeper.wait(60) == -signal.SIGSEGV
    finally:
        sleeper.kill()
        sleeper.wait(10)
    result = probing("core", str(written_core(tmp_path)))
    assert result.returncode == BAD_RECORD
    assert "is not the core of a Python process" in result.stderr and "sleep" in result.stderr


def test_files_that_are_no_core_are_refused_clearly(crash_core: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut-short"
    cut.write_bytes(crash_core.read_bytes()[: crash_core.stat().st_size // 2])
    noise = tmp_path / "noise"
    noise.write_bytes(os.urandom(100_000))
    expected = {
        cut: "is cut short:",
        noise: "is not a core file (no ELF header)",
        Path(sys.executable).resolve(): "not a core file",  # an ELF file, but an executable
        TARGETS / "segfaults.py": "is not a core file (no ELF header)",
    }
    for path, message in expected.items():
        result = probing("core", str(path))
        assert result.returncode == BAD_RECORD, (path, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    missing = probing("core", str(tmp_path / "no-such-core"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_a_core_whose_interpreter_is_gone_asks_for_exe(tmp_path: Path) -> None:
    """An interpreter that is one file (no libpython beside it to stand in): moved away after
    the crash, the core names a file that is not there; --exe finds it again."""
    system = find_interpreter("/usr/bin/python3.11")
    if system is None or b"libpython" in subprocess.run(["ldd", system], capture_output=True).stdout:
        pytest.skip("needs a CPython built without a shared libpython at /usr/bin/python3.11")
    copied = tmp_path / "python-copy"
    shutil.copy(system, copied)
    core = crash_with_core([str(copied), str(TARGETS / "segfaults.py")], tmp_path)
    moved = tmp_path / "python-moved"
    copied.rename(moved)
    gone = probing("core", str(core))
    assert gone.returncode == BAD_RECORD, gone.stderr
    assert "python-copy" in gone.stderr and "which is not on this machine" in gone.stderr
    assert "--exe" in gone.stderr
    found = rows_of(probing("core", str(core), "--exe", str(moved), "--format", "json"))
    assert any(row["func"] == "read_null" for row in found)
    wrong = probing("core", str(core), "--exe", shutil.which("sh") or "/bin/sh")
    assert wrong.returncode == BAD_RECORD and "--exe does not match the core" in wrong.stderr


NOBODY = 65534


def readable_by_anyone(path: str) -> bool:
    """Whether a user with no rights of their own may read `path`."""
    real = Path(os.path.realpath(path))
    return bool(real.stat().st_mode & stat.S_IROTH) and all(
        parent.stat().st_mode & stat.S_IXOTH for parent in real.parents
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="only root reads another user's core")
def test_root_reads_another_users_core_as_that_user(tmp_path: Path) -> None:
    """pystack parses an untrusted core in native code: run as root on a user's core, the reader
    drops to that user (it says as whom it ran, from inside); on root's own core it stays root."""
    candidates = [sys.executable, *(find_interpreter(pattern) for pattern in INTERPRETER_PATTERNS.values())]
    python = next((each for each in candidates if each and readable_by_anyone(each)), None)
    if python is None:
        pytest.skip(f"no interpreter that uid {NOBODY} may read (the reader, run as them, reads it)")
    core = crash_with_core([python, str(TARGETS / "segfaults.py")], tmp_path)
    os.chown(core, NOBODY, NOBODY)
    theirs = probing("--verbose", "core", str(core))
    assert theirs.returncode == 0, theirs.stderr
    assert f"--run-as {NOBODY}:{NOBODY}" in theirs.stderr
    assert f"the reader ran as uid {NOBODY}, gid {NOBODY}" in theirs.stderr
    assert "in read_null" in theirs.stdout
    os.chown(core, 0, 0)
    own = probing("--verbose", "core", str(core))
    assert own.returncode == 0 and "the reader ran as uid 0, gid 0" in own.stderr, own.stderr
    os.chown(core, NOBODY, NOBODY)
    core.chmod(0)  # root could read it; its owner, as whom it is read, could not
    closed = probing("core", str(core))
    assert closed.returncode == 5 and f"is not readable by its owner (uid {NOBODY})" in closed.stderr
