"""eval's promises about the job, and its requests' parameters (issue 11, item 11): process-
ending calls are refused in the eval thread unless forced, code that catches the interrupt is
reported as such and interrupted on until detach, and a malformed parameter is a BadRequest."""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from probing.agent.evaluate import exitguard
from probing.agent.server import AgentServer
from probing.errors import ExitCode
from probing.protocol.frames import MAX_REPLY_BYTES, recv_frame, send_frame
from probing.protocol.messages import request

from support import INTERPRETER_PATTERNS, Target, find_interpreter, probing, wait_until

PYTHON_38 = find_interpreter(INTERPRETER_PATTERNS["3.8"])
PYTHONS = [
    pytest.param(None, id="venv"),
    pytest.param(PYTHON_38, id="3.8", marks=[] if PYTHON_38 else [pytest.mark.skip(reason="no python 3.8")]),
]


@pytest.fixture(params=PYTHONS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    kwargs = {"python": request.param} if request.param else {}
    with Target("sleeper.py", **kwargs) as started:
        yield started


@pytest.mark.parametrize(
    "code, call",
    [
        ("import os; os._exit(3)", "os._exit(3)"),
        ("import posix; posix._exit(3)", "os._exit(3)"),
        ("import os; os.abort()", "os.abort()"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "os.kill("),
        ("import os, signal; os.killpg(os.getpgrp(), signal.SIGTERM)", "os.killpg("),
        ("import signal; signal.raise_signal(signal.SIGTERM)", "signal.raise_signal("),
        ("import os, sys; os.execv(sys.executable, [sys.executable, '-c', 'pass'])", "os.execv("),
        ("import _thread; _thread.interrupt_main()", "_thread.interrupt_main()"),
    ],
)
def test_process_ending_calls_are_refused_and_the_job_runs_on(target: Target, code: str, call: str) -> None:
    result = probing(str(target.pid), "eval", code)
    assert result.returncode == ExitCode.REMOTE_ERROR, result.stderr
    assert "ProcessExitRefused: " + call in result.stderr
    assert f"would end the job (PID {target.pid}); eval refuses process-ending calls" in result.stderr
    assert "--force" in result.stderr and "probing/agent" not in result.stderr
    assert target.alive()
    # The guards are gone once the eval has ended: the job has its own functions back (seen
    # from an unguarded eval, which installs none).
    check = "import os; [f for f in (os._exit, os.kill, os.abort) if hasattr(f, '__probing_real__')]"
    assert probing(str(target.pid), "eval", "--force", check).stdout == "[]\n"


def test_a_repl_statement_cannot_end_the_job_either(target: Target) -> None:
    result = probing(str(target.pid), "repl", input="import os\nos._exit(3)\n1 + 1\n", timeout=30)
    assert "ProcessExitRefused: os._exit(3)" in result.stdout + result.stderr
    assert "2" in result.stdout.split()  # the session went on after the refusal
    assert target.alive()


def test_signal_zero_to_itself_is_allowed(target: Target) -> None:
    assert probing(str(target.pid), "eval", "import os; os.kill(os.getpid(), 0)").returncode == 0


def test_force_lets_the_code_end_the_job(target: Target) -> None:
    probing(str(target.pid), "eval", "--force", "import os; os._exit(3)")
    assert target.process.wait(10) == 3


def test_the_guard_refuses_only_in_the_guarded_thread() -> None:
    """Installed process-wide, the wrappers call through for every other thread (the job's)."""
    real_kill = os.kill
    me = threading.get_ident()
    seen: List[Any] = []
    exitguard.guard(me)
    try:
        with pytest.raises(exitguard.ProcessExitRefused):
            os.kill(os.getpid(), signal.SIGTERM)
        other = threading.Thread(target=lambda: seen.append(os.kill(os.getpid(), 0)))
        other.start()
        other.join(5)
        assert seen == [None]
        assert os.kill is not real_kill
    finally:
        exitguard.release(me)
    assert os.kill is real_kill and not exitguard.installed()


def test_a_loop_that_catches_the_interrupt_is_said_so_and_detach_stops_the_retries(
    target: Target, tmp_path: Path
) -> None:
    report = tmp_path / "threads"
    code = (
        "import os, time\n"
        "caught = 0\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(0.02)\n"
        "        tasks = os.listdir('/proc/self/task')\n"
        "        names = sorted(open(f'/proc/self/task/{t}/comm').read().strip() for t in tasks)\n"
        f"        open({str(report)!r}, 'w').write(repr((caught, names)))\n"
        "    except BaseException:\n"
        "        try:\n"
        "            caught += 1\n"
        "        except BaseException:\n"
        "            pass\n"
    )
    result = probing(str(target.pid), "eval", "--timeout", "0.5", code)
    assert result.returncode == ExitCode.AGENT_TIMEOUT
    assert "it catches the interrupt (" in result.stderr
    assert "and keeps running in thread probing-eval-" in result.stderr
    assert "probing keeps interrupting it for 30 s (detach stops that)" in result.stderr

    def state() -> Tuple[int, List[str]]:
        try:
            value: Tuple[int, List[str]] = eval(report.read_text())
            return value
        except (OSError, SyntaxError):
            return 0, []

    caught_at_reply = state()[0]
    assert wait_until(lambda: state()[0] > caught_at_reply + 3, timeout=10)  # still interrupted
    assert probing(str(target.pid), "detach").returncode == 0
    # Detach took the interrupter (and the whole agent) away; the loop itself runs on, as said.
    assert wait_until(lambda: not any(name.startswith("probing-intr-") for name in state()[1]), timeout=10)
    assert wait_until(lambda: "probing-agent" not in state()[1], timeout=10)
    assert target.alive()


# --- parameters --------------------------------------------------------------------------


@pytest.fixture
def agent_end(tmp_path: Path) -> Iterator[socket.socket]:
    """One end of a socketpair served by a real agent connection loop."""
    server = AgentServer.bind(str(tmp_path))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.settimeout(10)
    thread = threading.Thread(target=server._serve_connection, args=(theirs,), daemon=True)
    thread.start()
    yield ours
    ours.close()
    server.stop()
    thread.join(5)


def error_of(sock: socket.socket, method: str, params: Dict[str, Any]) -> Dict[str, Any]:
    send_frame(sock, request(1, method, params))
    frame = recv_frame(sock, MAX_REPLY_BYTES)
    assert frame is not None and frame.header["ok"] is False, frame and frame.header
    error: Dict[str, Any] = frame.header["error"]
    return error


def test_a_hello_with_a_string_protocol_says_what_was_wrong(agent_end: socket.socket) -> None:
    error = error_of(agent_end, "hello", {"protocol": "1"})
    assert error["type"] == "BadRequest"
    assert error["message"] == "hello 'protocol' must be an integer (this agent speaks 1), not str '1'"
    # Nothing runs behind a refused hello.
    assert error_of(agent_end, "ping", {})["type"] == "ProtocolMismatch"


@pytest.mark.parametrize(
    "method, params, wanted",
    [
        ("eval", {"code": "1", "timeout": "abc"}, "eval 'timeout' must be a number of seconds"),
        ("eval", {"code": "1", "timeout": True}, "eval 'timeout' must be a number"),
        ("eval", {"code": "1", "timeout": 1e300}, "at most 86400"),
        ("eval", {"code": 1}, "eval needs a 'code' string, not int"),
        ("eval", {"code": "1", "frame": 3}, "eval 'frame' must be a THREAD:FUNCTION string"),
        ("eval", {"code": "1", "allow_exit": "yes"}, "eval 'allow_exit' must be true or false"),
        ("table", {"name": 5}, "name must be a string, not int 5"),
        ("table", {"name": "python.backtrace", "locals": "yes"}, "locals must be true or false"),
        ("table", {"name": "python.backtrace", "thread": 7}, "thread must be a string"),
        ("table", {"name": "python.backtrace", "repr_limit": "x"}, "repr_limit must be an integer"),
        ("table", {"name": "python.gc", "scan_budget_s": "x"}, "scan_budget_s must be a number"),
        ("backtrace", {"locals": 1}, "locals must be true or false"),
        ("memory", {"action": ["summary"]}, "memory action must be a string"),
        ("memory", {"top": "x"}, "top must be an integer"),
        ("nan", {"action": "on", "stop": "yes"}, "stop must be true or false"),
        ("repl", {"action": 3}, "repl action must be"),
        ("repl", {"action": "poll", "session": 3}, "repl poll needs a 'session' string"),
        ("repl", {"action": "push", "session": None}, "repl push needs a 'session' string"),
    ],
)
def test_malformed_parameters_are_bad_requests(
    agent_end: socket.socket, method: str, params: Dict[str, Any], wanted: str
) -> None:
    error = error_of(agent_end, method, params)
    assert error["type"] == "BadRequest", error
    assert wanted in error["message"]


def test_an_error_quoting_a_huge_parameter_still_fits_its_header(agent_end: socket.socket) -> None:
    error = error_of(agent_end, "table", {"name": "x" * 1_000_000})
    assert error["type"] == "NotFound" and len(error["message"]) < 5000
