"""What a new user trips over, with real processes: py-spy's and pystack's spellings through the
installed `probing` (its native front end hands them to the Python CLI), `list` on a terminal
and as another user, `eval --frame` while the job is deep in imports, and `make demo`."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import termios
from pathlib import Path
from typing import List

import pytest

from probing.errors import ExitCode

from support import PROBING, VENV_PYTHON, Target, probing

ROOT = Path(__file__).resolve().parents[2]
# A long argument, so that the job's command line is wider than the terminal below.
PADDING = "padding-" + "x" * 150
TERMINAL_COLUMNS = 100


def test_pyspy_habits_through_the_installed_command_get_probings_spelling() -> None:
    """`probing backtrace PID` is no command line the native front end answers: it goes to the
    Python CLI, which says the spelling that works, in one line, and runs nothing."""
    for args, spelled in (
        (["backtrace", "5259"], "probing 5259 backtrace"),
        (["dump", "--pid", "5259"], "probing 5259 backtrace"),
        (["remote", "5259"], "probing 5259 backtrace"),
        (["-p", "5259", "backtrace"], "probing 5259 backtrace"),
    ):
        result = probing(*args)
        assert result.returncode == ExitCode.USAGE and result.stdout == "", result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.endswith(f": {spelled}\n"), result.stderr


def listed_on_a_terminal(columns: int) -> List[str]:
    """`probing list` with its stdout on a terminal `columns` wide; the lines it printed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    environment = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    command = subprocess.Popen([PROBING, "list"], stdout=follower, stderr=subprocess.PIPE, env=environment)
    os.close(follower)
    printed = b""
    try:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every end of the terminal's other side is closed
                break
            if not chunk:
                break
            printed += chunk
        assert command.wait(60) == 0, command.stderr
    finally:
        os.close(leader)
        if command.poll() is None:
            command.kill()
            command.wait(10)
        if command.stderr is not None:
            command.stderr.close()
    return printed.decode().splitlines()


def test_list_fits_the_terminal_keeps_whole_lines_for_scripts_and_leaves_out_its_own() -> None:
    with Target("sleeper.py", args=[PADDING]) as job:
        lines = listed_on_a_terminal(TERMINAL_COLUMNS)
        assert max(len(line) for line in lines) <= TERMINAL_COLUMNS, lines
        assert any(line.split()[0] == str(job.pid) for line in lines[2:])
        piped = probing("list")
        assert any(
            line.startswith(f"{job.pid} ") and line.endswith(PADDING)
            for line in map(str.strip, piped.stdout.splitlines())
        )
        rows = {row["pid"]: row for row in json.loads(probing("list", "--format", "json").stdout)}
        assert rows[job.pid]["agent"] is True and rows[job.pid]["command"].endswith(PADDING)
        # `probing run`, which started the job, is probing at work: not one of the user's jobs.
        assert job.process.pid != job.pid and job.process.pid not in rows


def test_another_users_list_says_unknown_for_an_agent_it_cannot_see() -> None:
    """nobody cannot look into root's socket directory (mode 0700) nor read the job's
    environment: whether the job has an agent is unknown to it, not false."""
    system_python = "/usr/bin/python3.11"
    if os.geteuid() != 0 or not os.path.exists(system_python):
        pytest.skip("needs root (to run the job) and /usr/bin/python3.11 (nobody cannot enter /root)")
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the CLI's site-packages must suit /usr/bin/python3.11")
    # nobody may not run the venv's interpreter (under /root, with pyenv): Debian's 3.11 runs this
    # tree's CLI over the venv's site-packages (click, psutil) instead.
    path = os.pathsep.join([str(ROOT), sysconfig.get_paths()["purelib"]])
    with Target("sleeper.py") as job:
        as_nobody = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
             system_python, "-m", "probing", "list", "--format", "json"],
            capture_output=True, text=True, timeout=60, cwd="/",
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": path},
        )  # fmt: skip
        assert as_nobody.returncode == 0, as_nobody.stderr
        rows = {row["pid"]: row for row in json.loads(as_nobody.stdout)}
        assert rows[job.pid]["agent"] is None
        assert probing("list", "--format", "json").returncode == 0  # root itself sees it: true
        assert {row["pid"]: row for row in json.loads(probing("list", "--format", "json").stdout)}[job.pid][
            "agent"
        ]


def test_eval_frame_names_where_a_thread_deep_in_imports_is_in_one_short_line(tmp_path: Path) -> None:
    with Target("deep_import.py", via="env", args=[str(tmp_path)]) as job:
        result = probing(str(job.pid), "eval", "--frame", "MainThread:train", "1")
    assert result.returncode != 0 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(
        "probing: error: no frame of function 'train' is running (MainThread: <module> > main"
    )
    assert line.endswith("> import layer18 > import layer19 > serve)") and "more)" in line
    assert "_find_and_load" not in line and len(line) < 200, line


def test_the_demo_reads_as_a_story_one_screen_per_step(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    environment = dict(os.environ, PROBING_COMMAND=PROBING, PYTHON_COMMAND=VENV_PYTHON)
    environment["PROBING_RECORD_DIR"] = str(tmp_path)  # what the demo's jobs leave when stopped
    environment.pop("PROBING", None)
    demo = subprocess.Popen(
        ["bash", str(ROOT / "docs" / "examples" / "demo.sh")],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=environment, start_new_session=True,
    )  # fmt: skip
    try:
        printed, _ = demo.communicate(timeout=300)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)  # the script, and the jobs it started
            demo.wait(10)
    assert demo.returncode == 0, printed
    steps = re.split(r"^Step \d+/\d+\. ", printed, flags=re.MULTILINE)
    assert len(steps) == 6, printed  # what comes first, then five steps
    screen = max(40, shutil.get_terminal_size().lines)
    for step in steps[1:]:
        assert len(step.splitlines()) <= screen, step
    # A short list of the tables, and where the whole reference is; not every column of each.
    assert re.search(r"`probing \d+ tables` prints every column", printed)
    assert "python.torch_trace" in printed and "thread_id    BIGINT" not in printed
