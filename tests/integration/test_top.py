"""`probing PID top`: in a real terminal (tmux: the screen drawn in place, q quits, the terminal
given back), and as plain frames to a pipe; a process and a torchrun job with a stuck rank."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
import uuid
from typing import Iterator, List

import pytest

from probing.errors import ExitCode
from tools import need

from support import PROBING, Target, TorchrunJob, probing, wait_until


class Terminal:
    """A tmux session of its own, 200 columns by 40 lines, running one command, then saying how
    it exited (`EXIT=N`) and waiting, so that its last screen can be read."""

    def __init__(self, command: str) -> None:
        need("tmux")
        self.name = f"probing-top-{uuid.uuid4().hex[:8]}"
        # The terminal's own size, not one the tests' environment says (rich reads COLUMNS first).
        shell = f"env -u COLUMNS -u LINES {command}; echo EXIT=$?; sleep 60"
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", self.name, "-x", "200", "-y", "40", shell], check=True
        )

    def screen(self) -> str:
        shown = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True
        )
        return shown.stdout

    def press(self, key: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, key], check=True)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def _rows(screen: str) -> List[List[str]]:
    """The table's rows of a screen of `top --ranks`, split into words."""
    return [line.split() for line in screen.splitlines() if line.strip()[:1].isdigit() and "·" not in line]


@pytest.fixture(scope="module")
def stuck_job() -> Iterator[TorchrunJob]:
    """One job for the tests that only watch it: they come last, as it lives until the file ends."""
    with TorchrunJob(script="straggler_job.py", ranks=3, args=["--stuck", "1", "--step", "5"]) as job:
        yield job


def test_a_process_shows_each_thread_with_its_cpu_state_and_where() -> None:
    with Target("sleeper.py") as target:
        result = probing(str(target.pid), "top", "--count", "2", "--interval", "0.3")
        assert target.alive()
    assert result.returncode == ExitCode.OK, result.stderr
    first, second = result.stdout.split("\n\nPID ")
    assert first.startswith(f"PID {target.pid} · ") and "sleeper.py" in first.splitlines()[0]
    assert re.search(r"CPU \d+\.\d% · RSS ", first) and "stacks from its agent" in first, first
    rows = {
        line.split()[0]: line for line in second.splitlines() if line.startswith(("MainThread", "worker"))
    }
    assert set(rows) == {"MainThread", "worker"}, second
    # The columns are as wide as their widest cell, (other threads)' state among them.
    assert re.search(r"reading standard input +main_loop \(sleeper\.py:", rows["MainThread"]), second
    assert "waiting on an Event" in rows["worker"] and "from worker_loop (sleeper.py:" in rows["worker"]
    assert rows["MainThread"].split()[1] == "0.0"


def test_a_process_that_ends_ends_top_with_the_clis_error_and_a_record_is_no_live_target() -> None:
    target = Target("sleeper.py")
    try:
        recorded = probing(str(target.pid), "record", "--format", "json")
        assert recorded.returncode == ExitCode.OK, recorded.stderr
        record = json.loads(recorded.stdout)["path"]
        refused = probing(record, "top", "--count", "1")
        assert refused.returncode == ExitCode.NOT_LIVE and "`top` needs a live process" in refused.stderr
        command = [PROBING, str(target.pid), "top", "--interval", "0.3"]
        watching = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert watching.stdout is not None
        assert watching.stdout.readline().startswith(f"PID {target.pid}")
        target.kill()
        _, err = watching.communicate(timeout=30)
    finally:
        target.kill()
    assert watching.returncode == ExitCode.NO_SUCH_PROCESS, (watching.returncode, err)
    assert f"no process with PID {target.pid}" in err
    gone = probing(str(target.pid), "top", "--count", "1")
    assert gone.returncode == ExitCode.NO_SUCH_PROCESS


def test_top_of_a_job_ends_with_the_job() -> None:
    with TorchrunJob(script="straggler_job.py", ranks=2) as job:
        command = [PROBING, str(job.pids[0]), "top", "--ranks", "all", "--interval", "0.5"]
        watching = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert watching.stdout is not None
        assert watching.stdout.readline().startswith("job ")
        job.kill()
        _, err = watching.communicate(timeout=60)
    assert watching.returncode == ExitCode.NO_SUCH_PROCESS, (watching.returncode, err)
    assert "every rank of the job has ended" in err


def test_a_job_with_a_stuck_rank_on_a_real_terminal_shows_it_first_and_q_gives_the_terminal_back(
    stuck_job: TorchrunJob,
) -> None:
    terminal = Terminal(f"{shlex.quote(PROBING)} {stuck_job.pids[0]} top --ranks all")
    try:
        assert wait_until(lambda: "behind the others: rank 1" in terminal.screen(), timeout=60), (
            terminal.screen()
        )
        assert wait_until(
            lambda: [row[3] for row in _rows(terminal.screen())][:1] not in ([], ["-"]), timeout=20
        ), terminal.screen()
        screen = terminal.screen()
        lines = screen.splitlines()
        assert lines[0].startswith("job ") and lines[0].endswith(" · 3 of its 3 ranks on 1 node"), screen
        assert "q quits" in lines[1]
        assert lines[3].split() == [
            "RANK",
            "NODE",
            "PID",
            "CPU%",
            "RSS",
            "COLLECTIVE",
            "COLL/S",
            "STATE",
            "/",
            "WHERE",
        ]
        rows = _rows(screen)
        assert rows[0][:3] == ["1", "0", str(stuck_job.pids[1])], screen
        assert "sleeping in read (straggler_job.py:" in " ".join(rows[0])
        assert sorted(int(row[0]) for row in rows) == [0, 1, 2]
        pressed = time.monotonic()
        terminal.press("q")
        assert wait_until(lambda: "EXIT=0" in terminal.screen(), timeout=10), terminal.screen()
        assert time.monotonic() - pressed < 5
        # The alternate screen is left: the shell's own line is on the terminal again, the table gone.
        assert "RANK" not in terminal.screen()
    finally:
        terminal.close()


def test_a_job_to_a_pipe_is_printed_frame_after_frame_the_stuck_rank_first(stuck_job: TorchrunJob) -> None:
    result = probing(str(stuck_job.agent_pid), "top", "--ranks", "all", "--count", "2", "--interval", "0.5")
    assert result.returncode == ExitCode.OK, result.stderr
    frames = result.stdout.split("\n\njob ")
    assert len(frames) == 2, result.stdout
    for frame in frames:
        assert _rows(frame)[0][0] == "1", frame
        assert "q quits" not in frame and "\x1b[" not in frame  # no keys, no escapes: a pipe
    for frame in frames:  # CPU%, the first frame's measured since `top` began
        assert all(row[3] != "-" for row in _rows(frame)), frame
