"""The native front end (native/front/): on its own path, byte for byte what the Python CLI
prints for the same process; on any other, the Python CLI itself; py-spy started early only
for a job stuck on its GIL, and never for a healthy or busy one.

"Its own path" is proven by a copy of the front end with no Python CLI beside it: a fallback
there fails (exit 1), so a success is the native answer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from probing.cli import main
from probing.cli.spec import TARGET
from probing.outside import pyspy, spawn

from support import BIN, PROBING, Target, python_cli, run_bytes, wait_until

PYTHON_CLI = BIN / "probing-python"


@pytest.fixture
def front_alone(tmp_path: Path) -> str:
    """The front end without the Python CLI beside it: it can only answer natively."""
    copy = tmp_path / "alone" / "probing"
    copy.parent.mkdir()
    shutil.copy(BIN / "probing", copy)
    return str(copy)


def assert_same(pid: int, front: str, *form: str) -> None:
    native = run_bytes([front, *(form or (str(pid),)), "backtrace"])
    python = python_cli(pid)
    assert native.returncode == 0, native.stderr.decode(errors="replace")
    assert python.returncode == 0
    assert native.stdout == python.stdout
    assert native.stderr == python.stderr == b""


def test_installed_command_is_the_front_end() -> None:
    with open(PROBING, "rb") as command:
        assert command.read(4) == b"\x7fELF"
    assert PYTHON_CLI.read_text().startswith("#!")


@pytest.mark.parametrize(
    "script,args",
    [
        ("sleeper.py", []),
        ("front_states.py", []),
        ("escapes.py", []),
        ("many_threads.py", []),
        # An argv that is not UTF-8 and carries a terminal sequence and a bidi override.
        ("sleeper.py", [os.fsdecode(b"\xff\xfe-\x1b[31m-\xe2\x80\xae-\xc2\x9b")]),
        ("front_hostile.py", []),
    ],
    ids=["sleeper", "many-states", "escapes", "200-threads", "hostile-argv", "not-text-names"],
)
def test_same_bytes_as_the_python_cli(front_alone: str, script: str, args: List[str]) -> None:
    with Target(script, args=args) as target:
        assert_same(target.pid, front_alone)


def test_target_options(front_alone: str) -> None:
    """Every spelling of the target option cli/spec.py declares is answered natively: the front
    end takes them from there (gen_tables.py), as cli/fast.py and click do."""
    assert TARGET.short is not None
    with Target("sleeper.py") as target:
        pid = str(target.pid)
        for form in ([TARGET.short, pid], [TARGET.name, pid], [f"{TARGET.name}={pid}"]):
            assert_same(target.pid, front_alone, *form)


def test_torch_job(front_alone: str) -> None:
    pytest.importorskip("torch")
    with Target("torch_job.py", args=["--steps", "2"]) as target:
        # Settled: training stopped after two steps and the job idles.
        assert any(line == "done" for line in target.stdout_lines) or target.ready_line()
        run_bytes([PROBING, str(target.pid), "query", "SELECT 1"])  # the state after `done` only
        assert_same(target.pid, front_alone)


def test_dataloader_job(front_alone: str) -> None:
    pytest.importorskip("torch")
    with Target("dataloader_stuck.py") as target:
        # After "ready" the main thread still takes in what the other worker prefetched (a
        # batch's storage arriving over a socket) for a moment: the two reads are compared once
        # the main thread has settled in its wait, a settled stack being the same twice running.
        def settled() -> bool:
            return bool(python_cli(target.pid).stdout == python_cli(target.pid).stdout)

        assert wait_until(settled, 30, 0.2)
        assert_same(target.pid, front_alone)


def test_everything_else_goes_to_the_python_cli(front_alone: str) -> None:
    with Target("sleeper.py") as target:
        for args in (
            [str(target.pid), "backtrace", "--format", "json"],
            [str(target.pid), "backtrace", "--locals"],
            ["-v", str(target.pid), "backtrace"],
            [str(target.pid), "memory"],
            ["--help"],
        ):
            alone = run_bytes([front_alone, *args])
            assert alone.returncode == 1 and b"cannot run the Python CLI" in alone.stderr
            assert alone.stdout == b""
    for args in (["--help"], ["999999999", "backtrace"], ["0", "backtrace"], ["backtrace"]):
        front = run_bytes([PROBING, *args])
        python = run_bytes([str(PYTHON_CLI), *args])
        assert (front.returncode, front.stdout, front.stderr) == (
            python.returncode,
            python.stdout,
            python.stderr,
        )


def test_switch_forces_the_python_cli(front_alone: str) -> None:
    with Target("sleeper.py") as target:
        alone = run_bytes([front_alone, str(target.pid), "backtrace"], env={"PROBING_NATIVE_FRONT": "0"})
        assert alone.returncode == 1 and alone.stdout == b""


def test_no_agent_goes_to_the_python_cli(front_alone: str) -> None:
    with Target("sleeper.py", via="plain") as target:
        alone = run_bytes([front_alone, "--no-attach", str(target.pid), "backtrace"])
        assert alone.returncode == 1 and alone.stdout == b""
        alone = run_bytes([front_alone, str(target.pid), "backtrace"])
        assert alone.returncode == 1 and alone.stdout == b"", "no socket: attaching is the Python CLI's"


@pytest.fixture
def logged_py_spy(tmp_path: Path) -> Dict[str, Path]:
    """The front end and the Python CLI in a folder of their own, with a py-spy beside them
    that writes a line to a log for every run, then runs the real one."""
    folder = tmp_path / "bin"
    folder.mkdir()
    shutil.copy(BIN / "probing", folder / "probing")
    shutil.copy(PYTHON_CLI, folder / "probing-python")
    log = tmp_path / "py-spy.log"
    fake = folder / "py-spy"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {BIN / "py-spy"} "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return {"probing": folder / "probing", "log": log}


@pytest.mark.parametrize("script", ["sleeper.py", "busy.py", "front_states.py"])
def test_healthy_or_busy_job_never_gets_py_spy(logged_py_spy: Dict[str, Path], script: str) -> None:
    with Target(script) as target:
        for _ in range(5):
            result = run_bytes([str(logged_py_spy["probing"]), str(target.pid), "backtrace"])
            assert result.returncode == 0, result.stderr
        assert not logged_py_spy["log"].exists()


def test_gil_held_job_gets_py_spy_once_handed_over(logged_py_spy: Dict[str, Path]) -> None:
    with Target("gil_holder.py") as target:
        # The agent listens (its socket is bound before the job's code runs, but "ready" comes
        # from the holder's own thread).
        socket = Path(os.environ["PROBING_SOCKET_DIR"]) / f"{target.pid}.sock"
        assert wait_until(socket.exists)
        result = run_bytes([str(logged_py_spy["probing"]), str(target.pid), "backtrace"])
        python = python_cli(target.pid)
        assert result.returncode == python.returncode == 0, result.stderr
        assert result.stdout == python.stdout
        assert result.stderr == python.stderr
        assert b"holds the GIL" in result.stderr
        assert logged_py_spy["log"].read_text() == f"dump --pid {target.pid} --json\n"


def test_gil_held_job_answered_natively(front_alone: str) -> None:
    """py-spy on PATH (none beside this copy): the front end reads its dump and answers alone."""
    with Target("gil_holder.py") as target:
        socket = Path(os.environ["PROBING_SOCKET_DIR"]) / f"{target.pid}.sock"
        assert wait_until(socket.exists)
        path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
        native = run_bytes([front_alone, str(target.pid), "backtrace"], env={"PATH": path})
        python = python_cli(target.pid)
        assert native.returncode == 0, native.stderr
        assert (native.stdout, native.stderr) == (python.stdout, python.stderr)


# A py-spy that adds to the real one's dump a thread gone by the time its OS name is read (no
# such task), whose outermost frame is an agent thread's bootstrap: a connection's thread that
# ended as its client gave up on it.
GONE_AGENT_THREAD = """import json, subprocess, sys
threads = json.loads(subprocess.run([sys.argv[1], *sys.argv[2:]], capture_output=True, check=True).stdout)
def frame(name, path):
    return {"name": name, "filename": path, "short_filename": path.rsplit("/", 1)[1], "line": 1,
            "locals": None, "module": None}
threads.append({"pid": threads[0]["pid"], "thread_id": 1, "os_thread_id": 1 << 30, "thread_name": None,
    "active": False, "owns_gil": False, "frames": [frame("_recv_counted", "/x/probing/protocol/frames.py"),
                                                   frame("_bootstrap", "/x/probing/agent/threads.py")]})
print(json.dumps(threads))
"""


def test_an_agent_thread_gone_before_its_name_is_read_is_left_out(front_alone: str) -> None:
    """Both front ends tell an agent thread by its outermost frame (pyspy.is_agent_thread)."""
    folder = Path(front_alone).parent
    (folder / "gone.py").write_text(GONE_AGENT_THREAD)
    wrapper = f'#!/bin/sh\nexec {sys.executable} {folder / "gone.py"} {BIN / "py-spy"} "$@"\n'
    (folder / "py-spy").write_text(wrapper)
    (folder / "py-spy").chmod(0o755)
    path = {"PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"}
    with Target("gil_holder.py") as target:
        socket = Path(os.environ["PROBING_SOCKET_DIR"]) / f"{target.pid}.sock"
        assert wait_until(socket.exists)
        native = run_bytes([front_alone, str(target.pid), "backtrace"], env=path)
        python = run_bytes([PROBING, str(target.pid), "backtrace"], env={**path, "PROBING_NATIVE_FRONT": "0"})
        assert native.returncode == python.returncode == 0, (native.stderr, python.stderr)
        assert b"holds the GIL" in native.stderr and native.stdout == python.stdout
        assert b"_recv_counted" not in native.stdout + python.stdout


def test_a_py_spy_that_cannot_start_is_given_up(front_alone: str) -> None:
    """posix_spawn fails (ENOEXEC: a broken py-spy file): no PID came back, so none is killed
    or waited for; the command goes to the Python CLI (none beside this copy: exit 1)."""
    broken = Path(front_alone).parent / "py-spy"
    broken.write_bytes(b"\x00\x01 not a program\n")
    broken.chmod(0o755)
    with Target("gil_holder.py") as target:
        socket = Path(os.environ["PROBING_SOCKET_DIR"]) / f"{target.pid}.sock"
        assert wait_until(socket.exists)
        handed = run_bytes([front_alone, str(target.pid), "backtrace"], env={"PATH": "/nonexistent"})
        assert handed.returncode == 1 and b"cannot run the Python CLI" in handed.stderr, handed.stderr
        assert handed.stdout == b""
        assert target.process.poll() is None


def test_stopped_job_hands_the_dump_over(logged_py_spy: Dict[str, Path]) -> None:
    """Stopped, no thread runs and none holds the GIL: the Python CLI waits on for the agent,
    with the front end's py-spy output handed over rather than run again."""
    with Target("sleeper.py") as target:
        os.kill(target.pid, signal.SIGSTOP)
        try:
            result = run_bytes([str(logged_py_spy["probing"]), str(target.pid), "backtrace"])
            python = python_cli(target.pid)
        finally:
            os.kill(target.pid, signal.SIGCONT)
        # py-spy cannot read a stopped process either: the same failure, but for the seconds waited.
        assert result.returncode == python.returncode
        waited = re.compile(rb"within [0-9.]+ s")
        assert result.stdout == python.stdout
        assert waited.sub(b"", result.stderr) == waited.sub(b"", python.stderr)
        assert logged_py_spy["log"].read_text() == f"dump --pid {target.pid} --json\n"


def _handed_child(tmp_path: Path, output: bytes, target: int) -> int:
    """A child whose pipes are handed over as the front end hands py-spy's; its PID."""
    dump = tmp_path / "dump.json"
    dump.write_bytes(output)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    os.set_inheritable(out_read, True)  # as the front end leaves them, across its exec
    os.set_inheritable(err_read, True)
    child = os.posix_spawn(
        "/bin/cat",
        ["cat", str(dump)],
        os.environ,
        file_actions=[(os.POSIX_SPAWN_DUP2, out_write, 1), (os.POSIX_SPAWN_DUP2, err_write, 2)],
    )
    os.close(out_write)
    os.close(err_write)
    os.environ[spawn.HANDED_OVER] = f"{target}:{child}:{out_read}:{err_read}"
    return child


def _released(child: int, descriptors: List[int]) -> bool:
    """The hand-over's pipes are closed and its process reaped."""
    for descriptor in descriptors:
        try:
            os.fstat(descriptor)
            return False
        except OSError:
            pass
    try:
        os.waitpid(child, os.WNOHANG)
        return False
    except ChildProcessError:
        return True


def _pipes() -> List[int]:
    return [int(part) for part in os.environ[spawn.HANDED_OVER].split(":")[2:]]


def test_python_side_reads_the_handed_over_dump(tmp_path: Path) -> None:
    threads = [{"thread_id": 1, "os_thread_id": 4242, "thread_name": "MainThread", "frames": []}]
    child = _handed_child(tmp_path, json.dumps(threads).encode(), 4242)
    pipes = _pipes()
    with spawn.HandOverScope():
        # Out of the environment, and no program the CLI starts inherits the pipes.
        assert spawn.HANDED_OVER not in os.environ
        assert not any(os.get_inheritable(descriptor) for descriptor in pipes)
        assert pyspy.dump(4242, timeout=5.0) == threads
    assert _released(child, pipes)


def test_python_side_ignores_a_hand_over_for_another_target(tmp_path: Path) -> None:
    child = _handed_child(tmp_path, b"[]", 4242)
    pipes = _pipes()
    with spawn.HandOverScope():
        assert spawn.handed_over(4243, usable=True) is None
        assert _released(child, pipes)
    assert spawn.HANDED_OVER not in os.environ


def test_an_unused_hand_over_is_released_when_the_command_ends(tmp_path: Path) -> None:
    """The agent answered after all (or the command attached): nothing read py-spy's pipes,
    and they do not outlive the command, nor does py-spy stay a zombie."""
    child = _handed_child(tmp_path, b"[]", 4242)
    pipes = _pipes()
    assert spawn.HANDED_OVER == "PROBING_PYSPY"  # the name cli/__init__.py looks for
    assert main(["--version"]) == 0
    assert spawn.HANDED_OVER not in os.environ
    assert _released(child, pipes)


def test_a_hand_over_outside_a_command_is_not_read(tmp_path: Path) -> None:
    """Only `main` takes PROBING_PYSPY: a reading outside a command starts its own py-spy."""
    _handed_child(tmp_path, b"[]", 4242)
    try:
        assert spawn.handed_over(4242, usable=True) is None
        assert spawn.HANDED_OVER in os.environ
    finally:
        with spawn.HandOverScope():
            pass
