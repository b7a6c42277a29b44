"""Another tracer holding the job is named, with its own exit code (issue 25, item 11).

A thread has one tracer at a time: while strace or gdb holds the job, PTRACE_SEIZE fails with
EPERM even for root. Before the fix probing said "not allowed to ptrace PID" (exit 5) and
hinted at ptrace_scope and capabilities; now it names the tracer's PID and command and exits
17. A tracer that holds only some threads (`strace -p` without -f) is no obstacle: another
thread is borrowed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from probing.errors import ExitCode
from tools import need

from support import Target, probing, wait_until

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="needs /proc to see who traces a process"
)


def tracers(pid: int) -> Dict[int, int]:
    """{thread: PID of its tracer, 0 for none} for every thread of `pid`."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("TracerPid:"):
                found[int(task.name)] = int(line.split()[1])
    return found


class Tracer:
    """A real tracer process holding `job` (every thread, or its main thread only). stop() makes
    it let go as a user would: gdb quits (detaching) when its stdin closes, strace detaches on
    SIGTERM. A tracer killed outright would leave a job gdb stopped stopped."""

    def __init__(
        self, command: List[str], job: Target, every_thread: bool, quits_at_end_of_input: bool
    ) -> None:
        self.quits_at_end_of_input = quits_at_end_of_input
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.pid = self.process.pid

        def holding() -> bool:
            held = tracers(job.pid)
            if every_thread:
                return all(tracer == self.pid for tracer in held.values())
            return held.get(job.pid) == self.pid

        if not wait_until(holding, timeout=30):
            self.stop()
            raise RuntimeError(f"{command[0]} never held PID {job.pid}: {tracers(job.pid)}")

    def stop(self) -> None:
        if self.quits_at_end_of_input:
            assert self.process.stdin is not None
            self.process.stdin.close()
        else:
            self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def job() -> Iterator[Target]:
    with Target("sleeper.py", via="plain") as target:
        yield target


def _strace(job: Target, every_thread: bool) -> Tracer:
    if shutil.which("strace") is None:
        pytest.skip("strace not found")
    command = ["strace", *(["-f"] if every_thread else []), "-o", "/dev/null", "-p", str(job.pid)]
    return Tracer(command, job, every_thread, quits_at_end_of_input=False)


def _gdb(job: Target) -> Tracer:
    need("gdb")
    # gdb stops every thread while attached; `shell read` keeps it there until stdin closes.
    command = ["gdb", "-nx", "-batch", "-iex", "set auto-solib-add off", "-p", str(job.pid),
               "-ex", "shell read line"]  # fmt: skip
    return Tracer(command, job, every_thread=True, quits_at_end_of_input=True)


@pytest.mark.parametrize("tracer_kind", ["strace -f", "gdb"])
def test_a_job_another_tracer_holds_is_named_with_its_own_exit_code(job: Target, tracer_kind: str) -> None:
    tracer = _strace(job, every_thread=True) if tracer_kind == "strace -f" else _gdb(job)
    try:
        for command in (["backtrace"], ["eval", "1 + 1"], ["inject", "--method", "gdb"]):
            result = probing(str(job.pid), *command)
            assert result.returncode == ExitCode.TRACED, (command, result.stderr)
            name = tracer_kind.split()[0]
            assert f"probing: error: PID {job.pid} is traced by PID {tracer.pid} ({name} " in result.stderr
            assert "not allowed to ptrace" not in result.stderr and "ptrace_scope" not in result.stderr
            assert "hint: let that tracer finish or detach it" in result.stderr
    finally:
        tracer.stop()
    # Nothing was changed: once the tracer has let go, the job attaches as any other.
    assert wait_until(lambda: not any(tracers(job.pid).values()), timeout=15)
    after = probing(str(job.pid), "backtrace")
    assert after.returncode == 0, after.stderr
    assert "in main_loop" in after.stdout


def test_a_tracer_on_one_thread_leaves_another_to_borrow(job: Target) -> None:
    """`strace -p PID` traces the main thread only: the worker thread is borrowed instead."""
    tracer = _strace(job, every_thread=False)
    try:
        result = probing("-v", str(job.pid), "backtrace")
        assert result.returncode == 0, result.stderr
        assert f"thread {job.pid} is traced by PID {tracer.pid}; letting it be" in result.stderr
        assert "in main_loop" in result.stdout and "in worker_loop" in result.stdout
        assert tracers(job.pid)[job.pid] == tracer.pid  # strace still holds its thread
    finally:
        tracer.stop()
