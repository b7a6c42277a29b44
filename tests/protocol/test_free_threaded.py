"""A free-threaded CPython running with its GIL off (agent/gil.py): detected from the build's
Py_GIL_DISABLED and sys._is_gil_enabled(), and every read of other threads' frames refused
with a sentence and exit code 19, never made.

No 3.13t or 3.14t interpreter exists on this project's machines, so the detection is fed the
two answers such a build gives, and the refusal is seen through a real agent connection loop
on a socketpair and the client's mapping of its reply."""

from __future__ import annotations

import socket
import sys
import threading
from typing import Any, Callable, Iterator, Optional, Tuple

import pytest

from probing.agent import gil
from probing.agent.pytorch import safepoint
from probing.agent.requests import RequestError
from probing.agent.server import AgentServer
from probing.agent.stacks import current_frames
from probing.client.replies import error_from_reply
from probing.errors import ExitCode, GilDisabled
from probing.protocol.frames import MAX_REPLY_BYTES, recv_frame, send_frame
from probing.protocol.messages import PROTOCOL_VERSION, ErrorKind, request


def config(value: Any) -> Callable[[str], Any]:
    """sysconfig.get_config_var of a build whose Py_GIL_DISABLED is `value`."""
    return lambda name: value if name == "Py_GIL_DISABLED" else None


def enabled(value: bool) -> Callable[[], bool]:
    return lambda: value


def broken(*_: Any) -> Any:
    raise RuntimeError("cannot tell")


@pytest.mark.parametrize(
    ("py_gil_disabled", "gil_on", "without"),
    [
        (1, enabled(False), True),  # 3.13t / 3.14t as started: no GIL
        (1, enabled(True), False),  # the same build with PYTHON_GIL=1, or a module that turned it on
        (0, enabled(True), False),  # an ordinary 3.13+
        (None, None, False),  # 3.8-3.12: neither the variable nor the function
        (1, None, False),  # no way to ask whether it is off: as every build before 3.13
        (1, broken, False),
    ],
)
def test_only_a_free_threaded_build_with_its_gil_off_counts_as_running_without_it(
    py_gil_disabled: Any, gil_on: Optional[Callable[[], bool]], without: bool
) -> None:
    if gil_on is None:
        assert gil.gil_enabled(None) is (getattr(sys, "_is_gil_enabled", lambda: True)())
        assert not gil.running_without_gil(config(py_gil_disabled), enabled(True))
        return
    assert gil.running_without_gil(config(py_gil_disabled), gil_on) is without


def test_a_build_whose_configuration_cannot_be_read_has_a_gil() -> None:
    assert gil.free_threaded_build(config(1)) and not gil.free_threaded_build(config(0))
    assert not gil.free_threaded_build(broken)


def test_this_interpreter_runs_with_its_gil() -> None:
    """This machine has no free-threaded build: the agent reads here as it always did."""
    assert not gil.running_without_gil()
    assert current_frames()


@pytest.fixture
def without_gil(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a free-threaded build running with its GIL off would show itself."""
    monkeypatch.setattr(gil, "free_threaded_build", lambda config_var=None: True)
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)


def test_reading_other_threads_frames_is_refused_without_the_gil(without_gil: None) -> None:
    with pytest.raises(RequestError) as refused:
        current_frames()
    assert refused.value.error_type == ErrorKind.NO_GIL
    assert "reading the threads' frames is refused" in refused.value.message
    assert "free-threaded CPython" in refused.value.message and "GIL disabled" in refused.value.message


def test_values_between_steps_are_left_out_with_a_note_without_the_gil(without_gil: None) -> None:
    """The safe point's fallback (read while no thread is in autograd) holds only under the
    GIL: refused before `function` runs, so the table leaves the values out and says why."""
    ran = []
    with pytest.raises(safepoint.NotAtSafePoint, match="reading values between steps is refused"):
        safepoint.while_quiet(set(), lambda: ran.append(1))
    assert ran == []


@pytest.fixture
def agent_end(tmp_path: Any) -> Iterator[Tuple[socket.socket, AgentServer]]:
    """One end of a socketpair served by a real agent connection loop; the other end is ours."""
    server = AgentServer.bind(str(tmp_path))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.settimeout(10)
    thread = threading.Thread(target=server._serve_connection, args=(theirs,), daemon=True)
    thread.start()
    yield ours, server
    ours.close()
    server.stop()
    thread.join(5)


def test_backtrace_is_an_error_reply_that_exits_19_and_the_agent_keeps_serving(
    agent_end: Any, without_gil: None
) -> None:
    sock, _ = agent_end
    send_frame(sock, request(1, "backtrace", {"locals": False, "thread": None}))
    reply = recv_frame(sock, MAX_REPLY_BYTES)
    assert reply is not None and not reply.header["ok"]
    error = error_from_reply(reply.header["error"])
    assert type(error) is GilDisabled and error.exit_code == ExitCode.GIL_DISABLED == 19
    assert "free-threaded CPython" in error.message and "PYTHON_GIL=1" in error.hint
    send_frame(sock, request(2, "hello", {"protocol": PROTOCOL_VERSION}))  # what needs no frames
    hello = recv_frame(sock, MAX_REPLY_BYTES)
    assert hello is not None and hello.header["ok"]
