"""`probing PID repl` against real targets: through a pseudo-terminal as a person types, and with
lines piped in as a script would."""

from __future__ import annotations

import os
import pty
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from probing.agent.repl import session as repl
from probing.agent.server import AgentServer
from probing.errors import ExitCode
from probing.protocol.frames import MAX_REPLY_BYTES, recv_frame, send_frame
from probing.protocol.messages import request

from support import PROBING, Target, agent_threads, interpreter_params, probing, wait_until


@pytest.fixture(scope="module")
def stepper() -> Iterator[Target]:
    """A job whose main loop counts the global `step`; it also has a global `model`."""
    with Target("stepper.py") as target:
        yield target


def evaluate(target: Target, code: str) -> str:
    result = probing(str(target.pid), "eval", code)
    assert result.returncode == 0, result.stderr
    return result.stdout


def repl_threads(target: Target) -> List[str]:
    return [name for name in agent_threads(target.pid) if name.startswith("probing-repl")]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def piped(target: Target, script: str, env: Optional[dict] = None) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return probing(str(target.pid), "repl", input=script, timeout=30, env=env)


class Terminal:
    """`probing PID repl` on a pseudo-terminal: what it prints is read until an expected text
    shows up (never for a fixed time)."""

    def __init__(self, target_pid: int, home: Path) -> None:
        environment = dict(os.environ, TERM="dumb", HOME=str(home))
        environment.pop("PROBING", None)
        environment.pop("PROBING_HISTORY", None)
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: become probing
            try:
                os.execve(PROBING, [PROBING, str(target_pid), "repl"], environment)
            finally:
                os._exit(127)
        self.output = ""
        self.seen = 0
        self.status: Optional[int] = None

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, text: str, timeout: float = 15.0) -> str:
        """Everything printed since the last expect, up to and including `text`."""
        deadline = time.monotonic() + timeout
        while text not in self.output[self.seen :]:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._read(remaining):
                raise AssertionError(
                    f"no {text!r} in the terminal; it shows:\n{self.output[self.seen :]}\n{self.state()}"
                )
        end = self.output.index(text, self.seen) + len(text)
        shown, self.seen = self.output[self.seen : end], end
        return shown.replace("\r\n", "\n")

    def state(self) -> str:
        """The CLI's signal dispositions and where it is, for a failure to say why it is deaf."""
        try:
            with open(f"/proc/{self.pid}/status") as status:
                lines = [line for line in status if line.startswith(("State", "Sig", "Shd"))]
        except OSError as error:
            return f"(no /proc for the CLI: {error})"
        py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        where = subprocess.run([py_spy, "dump", "--pid", str(self.pid)], capture_output=True, text=True)
        return "".join(lines) + where.stdout + where.stderr

    def _read(self, timeout: float) -> bool:
        if not select.select([self.fd], [], [], timeout)[0]:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the program exited and closed the terminal
            return False
        self.output += data.decode("utf-8", "replace")
        return bool(data)

    def ctrl_c_at_the_prompt(self) -> str:
        """Ctrl-C while readline waits for a line. CPython's readline loop looks at signals only
        when its select() is interrupted: a SIGINT that comes as the prompt is being drawn,
        before the select, waits for the next one (Python's own REPL does the same)."""
        deadline = time.monotonic() + 10
        while True:
            self.send("\x03")
            try:
                return self.expect("KeyboardInterrupt", timeout=0.5)
            except AssertionError:
                if time.monotonic() > deadline:
                    raise

    def wait(self, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._read(0.05)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
        raise AssertionError(f"probing repl did not exit; the terminal shows:\n{self.output}")

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)


@pytest.fixture
def terminal(stepper: Target, tmp_path: Path) -> Iterator[Terminal]:
    opened = Terminal(stepper.pid, tmp_path)
    try:
        yield opened
    finally:
        opened.close()


def test_a_session_at_a_terminal(stepper: Target, terminal: Terminal, tmp_path: Path) -> None:
    """The issue's test: a multi-line definition, state kept between lines, Ctrl-C stopping
    `while True: pass` with the job alive and working, Ctrl-D leaving (history written)."""
    banner = terminal.expect(">>> ")
    assert f"in PID {stepper.pid} (" in banner and "Ctrl-C interrupts, Ctrl-D leaves." in banner
    terminal.send("def twice(x):\n")
    terminal.expect("... ")
    terminal.send("    return x * 2\n")
    terminal.expect("... ")
    terminal.send("\n")
    terminal.expect(">>> ")
    terminal.send("twice(21)\n")
    assert "\n42\n" in terminal.expect(">>> ")
    terminal.send("a = 5\n")
    terminal.expect(">>> ")
    terminal.send("a + 1\n")
    assert "\n6\n" in terminal.expect(">>> ")
    # Tab completion runs rlcompleter in the target: `ste` can only be the job's `step`.
    terminal.send("ste\t > 0\n")
    assert "step > 0\nTrue\n" in terminal.expect(">>> ")
    # ... from a copy of rlcompleter: the real one would import readline into the job.
    assert evaluate(stepper, "import sys; 'readline' in sys.modules or 'rlcompleter' in sys.modules") == (
        "False\n"
    )

    terminal.send("while True: pass\n")
    terminal.expect("... ")
    terminal.send("\n")
    assert wait_until(lambda: repl_threads(stepper), timeout=10)
    step_before = int(evaluate(stepper, "step"))
    terminal.send("\x03")
    interrupted = terminal.expect(">>> ")
    assert "KeyboardInterrupt" in interrupted and "while True: pass" in interrupted, interrupted
    assert wait_until(lambda: not repl_threads(stepper))
    terminal.send("twice(a)\n")
    assert "\n10\n" in terminal.expect(">>> ")
    assert stepper.alive()
    assert wait_until(lambda: int(evaluate(stepper, "step")) > step_before + 10)

    # Ctrl-C at a continuation prompt drops the incomplete statement, as Python's console does.
    terminal.send("if True:\n")
    terminal.expect("... ")
    terminal.ctrl_c_at_the_prompt()
    terminal.expect(">>> ")
    terminal.send("a\n")
    assert "\n5\n" in terminal.expect(">>> ")

    terminal.send("\x04")
    assert terminal.wait() == 0
    history = (tmp_path / ".probing_history").read_text()
    assert "def twice(x):" in history and "a = 5" in history


def test_a_statement_blocked_in_c_is_let_go_at_the_second_ctrl_c(stepper: Target, terminal: Terminal) -> None:
    terminal.expect(">>> ")
    terminal.send("import threading; gate = threading.Lock(); gate.acquire()\n")
    assert "\nTrue\n" in terminal.expect(">>> ")
    terminal.send("gate.acquire()\n")  # blocks in C: an interrupt lands only once it returns
    assert wait_until(lambda: repl_threads(stepper), timeout=10)
    terminal.send("\x03")
    # Two signals sent at once may arrive as one: the second Ctrl-C follows the interrupt.
    interrupted = (
        "import probing.agent.repl.session as r\n"
        "any(s.running.interrupted for s in r._sessions.values() if s.running)"
    )
    assert wait_until(lambda: evaluate(stepper, interrupted) == "True\n", timeout=10)
    terminal.send("\x03")
    assert "still running in the target, blocked outside Python; it will be interrupted when it " \
        "returns to Python" in terminal.expect(">>> ")  # fmt: skip
    # The session goes on; once the lock is free the abandoned statement meets its interrupt.
    terminal.send("gate.release()\n")
    terminal.expect(">>> ")
    assert wait_until(lambda: not repl_threads(stepper))
    terminal.send("6 * 7\n")
    assert "\n42\n" in terminal.expect(">>> ")


AgentEnd = Tuple[socket.socket, threading.Thread]


@pytest.fixture
def agent_end(tmp_path: Path) -> Iterator[AgentEnd]:
    """One end of a socketpair served by a real agent connection loop in this process."""
    server = AgentServer.bind(str(tmp_path))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.settimeout(10)
    thread = threading.Thread(target=server._serve_connection, args=(theirs,), daemon=True)
    thread.start()
    yield ours, thread
    ours.close()
    server.stop()
    thread.join(5)


def call(sock: socket.socket, params: Dict[str, Any]) -> Dict[str, Any]:
    send_frame(sock, request(1, "repl", params))
    frame = recv_frame(sock, MAX_REPLY_BYTES)
    assert frame is not None
    return frame.header


def test_bad_repl_requests_get_error_replies(agent_end: AgentEnd) -> None:
    sock, _ = agent_end
    assert call(sock, {"action": "dance"})["error"]["type"] == "BadRequest"
    assert call(sock, {"action": "poll", "session": "nope"})["error"]["type"] == "NoSession"
    token = call(sock, {"action": "open"})["result"]["session"]
    assert call(sock, {"action": "push", "session": token})["error"]["type"] == "BadRequest"
    reply = call(sock, {"action": "push", "session": token, "line": "6 * 7"})
    assert reply["ok"] and reply["result"]["stdout"] == "42\n"


def test_the_least_recently_used_session_goes_first(agent_end: AgentEnd) -> None:
    sock, _ = agent_end
    tokens = [call(sock, {"action": "open"})["result"]["session"] for _ in range(repl.MAX_SESSIONS)]
    assert call(sock, {"action": "poll", "session": tokens[0]})["ok"]  # now the most recent
    call(sock, {"action": "open"})
    assert call(sock, {"action": "poll", "session": tokens[1]})["error"]["type"] == "NoSession"
    assert call(sock, {"action": "poll", "session": tokens[0]})["ok"]
    for token in tokens:
        call(sock, {"action": "close", "session": token})


def test_a_closed_connection_interrupts_its_statement(agent_end: AgentEnd) -> None:
    sock, thread = agent_end
    token = call(sock, {"action": "open"})["result"]["session"]
    assert call(sock, {"action": "push", "session": token, "line": "while True: pass"})["result"]["more"]
    assert not call(sock, {"action": "push", "session": token, "line": ""})["result"]["done"]
    assert [name for name in agent_threads(os.getpid()) if name.startswith("probing-repl")]
    sock.close()
    thread.join(5)
    assert wait_until(
        lambda: not [name for name in agent_threads(os.getpid()) if name.startswith("probing-repl")]
    )
    assert token in repl._sessions  # the session outlives its connection, for a reconnect
    repl.handle(set(), {"action": "close", "session": token})


def test_deciding_whether_a_statement_is_complete_leaves_the_warnings_filters_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """codeop's trial compiles switch the process-wide filters ("error" on 3.8 and 3.9): a
    training thread warning at that moment would get an exception."""
    import warnings

    from probing.agent.evaluate.statements import command_compiler

    def touched(*args: object, **kwargs: object) -> None:
        raise AssertionError("the process-wide warnings filters were changed")

    compiler = command_compiler()
    monkeypatch.setattr(warnings, "catch_warnings", touched)
    monkeypatch.setattr(warnings, "simplefilter", touched)
    assert compiler("if True:", "<t>", "single") is None
    assert compiler("if True:\n    x = 1\n", "<t>", "single") is not None
    with pytest.raises(SyntaxError):
        compiler("def (:", "<t>", "single")


def test_names_assigned_stay_in_the_session_and_main_is_read_live(stepper: Target) -> None:
    script = (
        "model = None\n"
        "model is None\n"
        "first = step\n"
        "import time\n"
        "time.sleep(0.1)\n"
        "step > first\n"
        "def both():\n"
        "    return model, step > first\n"
        "\n"
        "both()\n"
        "class Uses:\n"
        "    seen = step > 0\n"
        "\n"
        "Uses.seen\n"
    )
    result = piped(stepper, script)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "True\nTrue\n(None, True)\nTrue\n"
    # The job's own `model` was never touched.
    assert evaluate(stepper, "model") == '"the job\'s model"\n'


def test_output_streams_while_the_statement_runs(stepper: Target, tmp_path: Path) -> None:
    go_on = tmp_path / "go-on"
    client = subprocess.Popen(
        [PROBING, str(stepper.pid), "repl"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert client.stdin is not None and client.stdout is not None
        client.stdin.write(
            "import os, time\n"
            "print('first')\n"
            f"while not os.path.exists({str(go_on)!r}): time.sleep(0.01)\n"
            "\n"
            "print('second')\n"
        )
        client.stdin.close()
        # The statement waits for go_on: its first line arrives while it still runs.
        assert client.stdout.readline() == "first\n"
        go_on.touch()
        assert client.stdout.readline() == "second\n"
        assert client.wait(15) == 0
    finally:
        client.kill()
        client.wait()


def test_a_killed_client_leaves_nothing_running(stepper: Target) -> None:
    client = subprocess.Popen([PROBING, str(stepper.pid), "repl"], stdin=subprocess.PIPE, text=True)
    try:
        assert client.stdin is not None
        client.stdin.write("while True: pass\n\n")
        client.stdin.flush()
        assert wait_until(lambda: repl_threads(stepper), timeout=10)
    finally:
        client.kill()
        client.wait()
    # The agent sees the connection close and interrupts the loop: no thread left, no CPU burnt.
    assert wait_until(lambda: not repl_threads(stepper), timeout=10)
    before = cpu_seconds(stepper.pid)
    time.sleep(0.5)
    assert cpu_seconds(stepper.pid) - before < 0.25
    assert stepper.alive()


def test_ctrl_c_stops_a_piped_script_as_it_would_stop_python(stepper: Target) -> None:
    client = subprocess.Popen(
        [PROBING, str(stepper.pid), "repl"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert client.stdin is not None
        client.stdin.write("while True: pass\n\nprint('not run')\n")
        client.stdin.close()
        assert wait_until(lambda: repl_threads(stepper), timeout=10)
        client.send_signal(signal.SIGINT)
        assert client.wait(15) == 130
        assert client.stdout is not None and client.stderr is not None
        out, err = client.stdout.read(), client.stderr.read()
    finally:
        client.kill()
        client.wait()
    assert out == ""
    assert "while True: pass" in err and err.rstrip().endswith("KeyboardInterrupt")
    assert wait_until(lambda: not repl_threads(stepper))


def test_errors_are_shown_and_the_session_goes_on(stepper: Target) -> None:
    result = piped(stepper, "def broken(:\n1 / 0\nraise SystemExit(3)\nprint('still here')\n")
    assert result.stdout == "still here\n"
    assert '  File "<probing-repl-' in result.stderr
    assert "SyntaxError: invalid syntax" in result.stderr
    assert "Traceback (most recent call last):" in result.stderr
    assert "ZeroDivisionError: division by zero" in result.stderr
    assert "SystemExit: 3" in result.stderr and "probing/agent" not in result.stderr
    # Piped in, a statement that raised makes the exit status 8, as for eval.
    assert result.returncode == ExitCode.REMOTE_ERROR
    assert stepper.alive()


def test_exit_leaves_the_repl_not_the_job(stepper: Target) -> None:
    result = piped(stepper, "exit()\nprint('not run')\n")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert stepper.alive() and evaluate(stepper, "import sys; sys.stdin.closed") == "False\n"


def test_the_session_survives_the_agent_closing_an_idle_connection(stepper: Target) -> None:
    evaluate(stepper, "import probing.agent.server as server; server.IDLE_TIMEOUT_S = 0.3")
    try:
        client = subprocess.Popen(
            [PROBING, str(stepper.pid), "repl"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert client.stdin is not None and client.stdout is not None
        client.stdin.write("x = 41\nx\n")
        client.stdin.flush()
        assert client.stdout.readline() == "41\n"
        # Idle past the timeout: the agent closes the connection; the next line reconnects.
        time.sleep(0.6)
        client.stdin.write("x + 1\n")
        client.stdin.close()
        assert client.stdout.readline() == "42\n"
        assert client.wait(15) == 0
    finally:
        evaluate(stepper, "import probing.agent.server as server; server.IDLE_TIMEOUT_S = 600.0")


def test_a_session_dropped_by_the_agent_is_replaced(stepper: Target) -> None:
    client = subprocess.Popen(
        [PROBING, str(stepper.pid), "repl"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert client.stdin is not None and client.stdout is not None and client.stderr is not None
    client.stdin.write("x = 41\nx\n")
    client.stdin.flush()
    assert client.stdout.readline() == "41\n"
    # As if nobody had used it for two hours: the agent drops it at the next request.
    evaluate(
        stepper, "import probing.agent.repl.session as r\nfor s in r._sessions.values(): s.last_used -= 7200"
    )
    client.stdin.write("'x' in dir()\n")
    client.stdin.close()
    assert client.stdout.readline() == "False\n"
    assert client.wait(15) == 0
    assert "the agent dropped this repl session (unused for an hour" in client.stderr.read()


@pytest.mark.parametrize(
    "python",
    [param for param in interpreter_params() if param.id in ("3.8", "3.13")],  # type: ignore[attr-defined]
)
def test_the_oldest_and_newest_pythons(python: str) -> None:
    """The namespace trick and the console's compiling hold in the target's own interpreter."""
    script = (
        "from __future__ import annotations\n"
        "model = 'mine'\n"
        "def look(x: NotDefinedAnywhere):\n"
        "    return model, step > 0\n"
        "\n"
        "look(1)\n"
        "look.__annotations__\n"
        "class Reads:\n"
        "    main_step = step >= 0\n"
        "\n"
        "Reads.main_step, _\n"
        "for i in range(2): i\n"
        "\n"
    )
    with Target("stepper.py", python=python) as target:
        result = piped(target, script)
        assert (result.returncode, result.stderr) == (0, "")
        annotations = "{'x': 'NotDefinedAnywhere'}"
        assert result.stdout == f"('mine', True)\n{annotations}\n(True, {annotations})\n0\n1\n"
        assert evaluate(target, "model") == '"the job\'s model"\n'


def test_the_process_exiting_ends_the_repl(tmp_path: Path) -> None:
    with Target("stepper.py") as target:
        client = subprocess.Popen(
            [PROBING, str(target.pid), "repl"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert client.stdin is not None and client.stdout is not None
        client.stdin.write("1 + 1\n")
        client.stdin.flush()
        assert client.stdout.readline() == "2\n"
        target.kill()
        client.stdin.write("1 + 2\n")
        client.stdin.close()
        code = client.wait(15)
        assert client.stderr is not None
        said = client.stderr.read()
        assert code == ExitCode.NO_SUCH_PROCESS, (code, said)
        assert f"PID {target.pid} exited; the repl session ended with it" in said


def test_a_detached_agent_ends_the_repl() -> None:
    with Target("stepper.py") as target:
        client = subprocess.Popen(
            [PROBING, str(target.pid), "repl"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert client.stdin is not None and client.stdout is not None and client.stderr is not None
        client.stdin.write("1 + 1\n")
        client.stdin.flush()
        assert client.stdout.readline() == "2\n"
        assert probing(str(target.pid), "detach").returncode == 0
        client.stdin.write("1 + 2\n")
        client.stdin.close()
        assert client.wait(15) == ExitCode.NO_AGENT
        assert "was stopped (detach); the repl session ended with it" in client.stderr.read()
        assert target.alive()


def test_bad_targets_are_clear_errors() -> None:
    missing = probing("999999999", "repl", input="1\n")
    assert missing.returncode == ExitCode.NO_SUCH_PROCESS
    assert "no process with PID 999999999" in missing.stderr
    plain = Target("sleeper.py", via="plain")
    with plain:
        refused = probing("--no-attach", str(plain.pid), "repl", input="1\n")
        assert refused.returncode == ExitCode.NO_AGENT and "has no probing agent" in refused.stderr
        assert plain.alive()
        # Without --no-attach, a process without an agent is attached to first.
        attached = probing(str(plain.pid), "repl", input="type(stop).__name__\n")
        assert (attached.returncode, attached.stdout) == (0, "'Event'\n"), attached.stderr
