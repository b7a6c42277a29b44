"""`probing run`: start a command with the agent enabled in every Python process it starts.

PROBING=1 starts the agent through the .pth file in an environment where probing is
installed; for any other interpreter, the bootstrap directory on PYTHONPATH does it (its
sitecustomize loads the agent by file path and then removes itself from sys.path).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType
from typing import Any, Callable, Dict, List, Optional

from ..errors import ExitCode, ProbingError

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bootstrap")

# Signals passed on to the child. SIGINT is special: see _forward.
FORWARDED_SIGNALS = (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
)  # fmt: skip


class CommandNotFound(ProbingError):
    exit_code = ExitCode.COMMAND_NOT_FOUND


class CommandNotExecutable(ProbingError):
    exit_code = ExitCode.COMMAND_NOT_EXECUTABLE


def agent_environment(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["PROBING"] = "1"
    paths = [BOOTSTRAP_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _terminal_delivers_sigint() -> bool:
    """True when Ctrl-C from our terminal reaches the child directly (same foreground group)."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            if stream is not None and stream.isatty():
                return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError):
            continue
    return False


class Launcher:
    def __init__(
        self, command: List[str], env: Optional[Dict[str, str]] = None, listen: Optional[str] = None
    ) -> None:
        self.command = command
        self.env = agent_environment(env)
        if listen is not None:
            # Each agent of the job listens on TCP (the job's token, from its environment).
            self.env["PROBING_LISTEN"] = listen
        self.process: Optional[subprocess.Popen[bytes]] = None
        self._previous_handlers: Dict[int, Any] = {}

    def start(self) -> subprocess.Popen[bytes]:
        # Forwarding starts with the child, not at wait(): a signal sent as soon as the job
        # says it is ready (a CI runner's SIGINT) must reach it, not end this process first.
        self._previous_handlers = {
            signum: signal.signal(signum, self._forward) for signum in FORWARDED_SIGNALS
        }
        try:
            self.process = subprocess.Popen(self.command, env=self.env)
        except FileNotFoundError:
            self._restore_handlers()
            raise CommandNotFound(f"{self.command[0]}: command not found") from None
        except PermissionError:
            self._restore_handlers()
            raise CommandNotExecutable(f"{self.command[0]}: permission denied") from None
        return self.process

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}

    def _forward(self, signum: int, frame: Optional[FrameType]) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        # Ctrl-C at a terminal already went to the whole foreground process group, child
        # included; sending it again would interrupt the job's own KeyboardInterrupt handling.
        if signum == signal.SIGINT and _terminal_delivers_sigint():
            return
        try:
            process.send_signal(signum)
        except ProcessLookupError:
            pass

    def wait(self, tick: Optional[Callable[[], Optional[int]]] = None, interval: float = 1.0) -> int:
        """Wait, forwarding signals: the child's exit status, or 128+N if signal N killed it.

        `tick` is called every `interval` seconds while the child runs; when it returns an
        exit code (the watchdog found the job hung and ended it), that code is returned.
        """
        assert self.process is not None
        try:
            while True:
                try:
                    returncode = self.process.wait(timeout=interval if tick is not None else None)
                    break
                except subprocess.TimeoutExpired:
                    assert tick is not None
                    verdict = tick()
                    if verdict is not None:
                        self.process.wait()
                        return verdict
        finally:
            self._restore_handlers()
        return returncode if returncode >= 0 else 128 - returncode
