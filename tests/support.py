"""Real target processes for the integration tests, and the probing command to run at them.

Targets are tiny scripts under tests/targets/ that print "ready" when they are set up; the
tests wait for that line (never a sleep) and every target is killed in a fixture finaliser.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

TESTS = Path(__file__).resolve().parent
TARGETS = TESTS / "targets"
BIN = Path(sys.executable).parent
PROBING = str(BIN / "probing")
VENV_PYTHON = sys.executable

# Every CPython the integration tests run the agent under: the pyenv versions and Debian's
# stripped system interpreter. A missing one is skipped by name, never silently.
INTERPRETER_PATTERNS = {
    "3.8": "~/.pyenv/versions/3.8*/bin/python3.8",
    "3.9": "~/.pyenv/versions/3.9*/bin/python3.9",
    "3.10": "~/.pyenv/versions/3.10*/bin/python3.10",
    "3.11": "~/.pyenv/versions/3.11*/bin/python3.11",
    "3.12": "~/.pyenv/versions/3.12*/bin/python3.12",
    "3.13": "~/.pyenv/versions/3.13*/bin/python3.13",
    "debian-3.11": "/usr/bin/python3.11",
}


def find_interpreter(pattern: str) -> Optional[str]:
    matches = sorted(glob.glob(os.path.expanduser(pattern)))
    return matches[-1] if matches else None


def interpreter_params() -> List[object]:
    params: List[object] = []
    for name, pattern in INTERPRETER_PATTERNS.items():
        path = find_interpreter(pattern)
        marks = [] if path else [pytest.mark.skip(reason=f"python {name} not found at {pattern}")]
        params.append(pytest.param(path, id=name, marks=marks))
    return params


class Target:
    """A target process. `via`: 'run' (probing run -- PYTHON script), 'env' (PROBING=1) or
    'plain' (no agent: for attaching to)."""

    def __init__(
        self,
        script: str,
        python: str = VENV_PYTHON,
        via: str = "run",
        args: Optional[List[str]] = None,
        env: Optional[Dict[str, str]] = None,
        ready_timeout: float = 60.0,
    ) -> None:
        environment = dict(os.environ, PYTHONUNBUFFERED="1")
        environment.pop("PROBING", None)
        environment.update(env or {})
        command = [python, str(TARGETS / script), *(args or [])]
        if via == "run":
            command = [PROBING, "run", "--", *command]
        elif via == "env":
            environment["PROBING"] = "1"
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
        )
        self.pid = self.process.pid  # until the child's PID is known (probing run)
        self.stdout_lines: List[str] = []
        self.stderr_lines: List[str] = []
        self._ready = threading.Event()
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout_lines, True)),
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr_lines, False)),
        ]
        for reader in self._readers:
            reader.daemon = True
            reader.start()
        if not self._ready.wait(ready_timeout):
            self.kill()
            raise RuntimeError(f"target {script} never said ready: {self.output()}")
        self.pid = self._target_pid(via)

    def _read(self, stream: object, lines: List[str], watch: bool) -> None:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            line = raw.decode("utf-8", "replace").rstrip("\n")
            lines.append(line)
            if watch and line.startswith("ready"):
                self._ready.set()

    def _target_pid(self, via: str) -> int:
        if via != "run":
            return self.process.pid
        for line in self.stderr_lines:
            match = re.match(r"probing: started PID (\d+)", line)
            if match:
                return int(match.group(1))
        raise RuntimeError(f"probing run printed no PID: {self.stderr_lines}")

    def ready_line(self) -> str:
        return next(line for line in self.stdout_lines if line.startswith("ready"))

    def output(self) -> str:
        return "\n".join(self.stdout_lines) + "\n--- stderr ---\n" + "\n".join(self.stderr_lines)

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{self.pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"

    def finish(self, timeout: float = 20.0) -> int:
        """Close the target's stdin (its signal to exit) and wait for it."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.close()
        except OSError:
            pass
        code = self.process.wait(timeout)
        for reader in self._readers:
            reader.join(5)
        return code

    def kill(self) -> None:
        """Kill the target and its descendants: a DataLoader worker stuck in __getitem__ never
        looks at whether its parent is alive, and would outlive the test."""
        import psutil

        try:
            descendants = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        for process in descendants:
            try:
                process.kill()
            except psutil.Error:
                pass
        if self.process.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.kill()
            self.process.wait(10)

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


class TorchrunJob:
    """A real torchrun job of tests/targets/ranks_job.py (gloo, CPU), `ranks` processes on this
    machine, standalone (its own rendezvous port, so two jobs never share one). Ready once every
    rank said `ready RANK PID`; `pids` maps rank to PID, `agent_pid` is torchrun's own process.
    The whole session (torchrun and its ranks) is killed on exit."""

    def __init__(self, scenario: str = "healthy", ranks: int = 4, args: Optional[List[str]] = None,
                 env: Optional[Dict[str, str]] = None, ready_timeout: float = 120.0) -> None:  # fmt: skip
        environment = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        environment.pop("PROBING", None)
        environment.update(env or {})
        command = [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={ranks}",
                   str(TARGETS / "ranks_job.py"), "--scenario", scenario, *(args or [])]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=environment, start_new_session=True,
        )  # fmt: skip
        self.agent_pid = self.process.pid
        self.pids: Dict[int, int] = {}
        self.stdout_lines: List[str] = []
        self.stderr_lines: List[str] = []
        self._ready = threading.Event()
        self._expected = ranks
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout_lines), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr_lines), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        if not self._ready.wait(ready_timeout):
            self.kill()
            raise RuntimeError(f"torchrun job never got ready: {self.output()}")

    def _read(self, stream: object, lines: List[str]) -> None:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            line = raw.decode("utf-8", "replace").rstrip("\n")
            lines.append(line)
            match = re.match(r"ready (\d+) (\d+)$", line)
            if match:
                self.pids[int(match.group(1))] = int(match.group(2))
                if len(self.pids) == self._expected:
                    self._ready.set()

    def output(self) -> str:
        return "\n".join(self.stdout_lines) + "\n--- stderr ---\n" + "\n".join(self.stderr_lines[-40:])

    def kill(self) -> None:
        """torchrun starts each rank in a session of its own: they are killed one by one."""
        import psutil

        try:
            agent = psutil.Process(self.agent_pid)
            processes = [agent, *agent.children(recursive=True)]
        except psutil.Error:
            processes = []
        # A rank whose torchrun died first is no child of it any more.
        for pid in self.pids.values():
            try:
                rank = psutil.Process(pid)
                if "ranks_job.py" in " ".join(rank.cmdline()):
                    processes.append(rank)
            except psutil.Error:
                pass
        for process in processes:
            try:
                process.kill()
            except psutil.Error:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(30)

    def __enter__(self) -> TorchrunJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def probing(
    *args: str,
    input: Optional[str] = None,
    timeout: float = 60.0,
    env: Optional[Dict[str, str]] = None,
) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """Run the installed `probing` command; returns the completed process (text)."""
    environment = dict(os.environ)
    environment.pop("PROBING", None)
    environment.update(env or {})
    return subprocess.run(
        [PROBING, *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )


def wait_until(condition: object, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll a condition until it holds; for states with no event to wait on (a file removed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(condition())  # type: ignore[operator]
