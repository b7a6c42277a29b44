"""A node's relay (issue 28): one agent asks the other ranks of its node for the CLI and hands
back every reply in one frame, so that a job of 1 024 ranks on 16 nodes costs the CLI 16
authenticated TCP connections instead of 1 024.

The relay does transport only: each of its node's agents is asked over its Unix socket exactly
what the CLI would have asked it (a hello, then one request), and what each answers is passed
on as it came, undecoded: the CLI reads it as it reads a reply of its own, with every check it
makes on one (engine/jobs/relayed.py). So the relay adds no rule and no trust: it reaches only
agents of its own user, in its own socket folder, whose process is the PID it was told (the
peer's credentials), which the CLI holding the job's token could reach through this agent's
`eval` anyway.

It runs on agent threads that wait on sockets (the GIL let go), at most RELAY_THREADS at once,
all within the request's own timeout; a rank that does not answer in time is named with why,
and the others are answered.
"""

from __future__ import annotations

import os
import stat

from .. import __version__
from ..originals import Socket, allocate_lock, get_ident, monotonic, socket_timeout
from ..protocol.frames import (
    MAX_REPLY_BYTES,
    FrameError,
    FrameReader,
    FrameTimeout,
    frame_buffers,
    send_buffers,
)
from ..protocol.messages import PROTOCOL_VERSION, request
from .requests import ErrorKind, RequestError, float_param
from .sockets import lifted
from .threads import AgentThread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

# The most ranks one relay request names (a node runs 8 to 64; more is a bug or an attack).
MAX_CALLS = 1024
# Threads asking at once: a node's ranks answer in about one rank's time with 16 of them.
RELAY_THREADS = 16
# A call that waits out a window (`watch`: hang's samples; `sample`: stacks sampled for a
# flame graph or stragglers) holds its thread for the window, so each gets a thread of its own,
# up to this many in all: a node's ranks are watched at once.
WINDOWED = ("watch", "sample")
MAX_RELAY_THREADS = 128
# What one relay reply may carry in all: the sum of what its ranks send, at most what one reply
# to the CLI may be.
MAX_RELAYED_BYTES = MAX_REPLY_BYTES
# Methods not passed on: a relay asking a relay, and what changes the agent's connection.
NOT_RELAYED = ("relay", "hello", "detach", "repl")


class _Call:
    """One rank's request, and what its agent answered: the reply frames' headers and payload."""

    __slots__ = ("pid", "method", "params", "answered", "error", "sent")

    def __init__(self, pid: int, method: str, params: Dict[str, Any]) -> None:
        self.pid = pid
        self.method = method
        self.params = params
        # (hello header, reply header, payload), set at once: a thread still asking when the
        # relay answers (past the deadline) sets it too late to be read half-made.
        self.answered: Optional[Tuple[Dict[str, Any], Dict[str, Any], Any]] = None
        self.error: Optional[str] = None
        self.sent = False  # whether the request went out (else the CLI may ask the rank itself)


def _calls(params: Dict[str, Any]) -> List[_Call]:
    listed = params.get("calls")
    if not isinstance(listed, list) or not 0 < len(listed) <= MAX_CALLS:
        raise RequestError(ErrorKind.BAD_REQUEST, f"calls must be a list of 1 to {MAX_CALLS} requests")
    calls = []
    for each in listed:
        pid = each.get("pid") if isinstance(each, dict) else None
        method = each.get("method") if isinstance(each, dict) else None
        call_params = each.get("params", {}) if isinstance(each, dict) else None
        if not (isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 1 << 31):
            raise RequestError(ErrorKind.BAD_REQUEST, "each call needs the pid of a process of this node")
        if not isinstance(method, str) or method in NOT_RELAYED or not isinstance(call_params, dict):
            raise RequestError(ErrorKind.BAD_REQUEST, f"a call's method cannot be relayed: {method!r:.40}")
        calls.append(_Call(pid, method, call_params))
    return calls


def _connect(directory: str, pid: int, timeout: float) -> Any:
    """A connection to the agent of `pid`, once its socket and the process answering on it are
    this user's and that PID; ValueError saying why not."""
    path = os.path.join(directory, f"{pid}.sock")
    try:
        info = os.lstat(path)
    except OSError:
        raise ValueError(f"no agent socket at {path}") from None
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
        raise ValueError(f"{path} is not a socket of this user's")
    sock = lifted(Socket(1, 1))  # AF_UNIX, SOCK_STREAM, up high (sockets.high_descriptor)
    try:
        sock.settimeout(max(0.001, timeout))
        sock.connect(path)
        import struct

        credentials = sock.getsockopt(1, 17, 12)  # SOL_SOCKET, SO_PEERCRED: pid, uid, gid
        peer_pid, peer_uid, _ = struct.unpack("3i", credentials)
        if peer_pid != pid or peer_uid != os.geteuid():
            raise ValueError(f"{path} is answered by PID {peer_pid} (uid {peer_uid}), not PID {pid}")
        return sock
    except BaseException:
        sock.close()
        raise


def _ask(directory: str, call: _Call, deadline: float) -> None:
    try:
        sock = _connect(directory, call.pid, deadline - monotonic())
    except ValueError as error:
        call.error = str(error)
        return
    except OSError as error:
        call.error = f"cannot connect: {error.strerror or error}"
        return
    try:
        hello = {"protocol": PROTOCOL_VERSION, "client": __version__}
        asked = request(2, call.method, call.params)
        call.sent = True
        send_buffers(sock, frame_buffers(request(1, "hello", hello)) + frame_buffers(asked))
        reader = FrameReader(sock, MAX_REPLY_BYTES)
        frames = []
        for _ in range(2):
            frame = reader.read(deadline=deadline)
            if frame is None:
                call.error = "the agent closed the connection before answering"
                return
            frames.append(frame)
        call.answered = (frames[0].header, frames[1].header, frames[1].payload)
    except (FrameTimeout, socket_timeout):
        call.error = "no answer in time"
    except FrameError as error:
        call.error = str(error)
    except OSError as error:
        call.error = f"the connection failed: {error.strerror or error}"
    finally:
        sock.close()


def relay(server: Any, params: Dict[str, Any]) -> Tuple[Dict[str, Any], List[Any]]:
    """`calls`: [{pid, method, params}] for agents of this node; `timeout`: seconds for all.
    The result lists, per call in order, the hello and reply headers its agent sent and where
    its payload lies in this reply's payload (`offset`, `size`), or the `error` that kept it and
    whether the request had gone out (`sent`)."""
    calls = _calls(params)
    timeout = float_param(params, "timeout", 5.0, 0.001, 1200.0)  # a `watch` of 600 s and its slack
    deadline = monotonic() + timeout
    directory = os.path.dirname(server.path)
    queue = list(reversed(calls))
    lock = allocate_lock()

    gate = allocate_lock()
    gate.acquire()

    def work() -> None:
        with gate:  # every worker is the agent's before any asks (the relay may ask itself)
            pass
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    call = queue.pop()
                if monotonic() >= deadline:
                    call.error = "no answer in time (the relay's other ranks took it all)"
                    continue
                _ask(directory, call, deadline)
        finally:
            server.own_threads.discard(get_ident())

    windowed = sum(1 for call in calls if call.method in WINDOWED)
    count = min(RELAY_THREADS + windowed, MAX_RELAY_THREADS, len(calls))
    threads = [AgentThread(target=work, name="probing-relay") for _ in range(count)]
    started = []
    try:
        for thread in threads:
            thread.start()
            started.append(thread)
            server.own_threads.add(thread.ident)  # in no backtrace of the job
    finally:
        gate.release()
    for thread in started:
        thread.join(max(0.0, deadline - monotonic()) + 0.5)
    return _answer(calls)


def _answer(calls: List[_Call]) -> Tuple[Dict[str, Any], List[Any]]:
    """The relay's reply: each call's headers and where its payload lies, or why it has none."""
    answers: List[Dict[str, Any]] = []
    chunks: List[Any] = []
    offset = 0
    for call in calls:
        answered = call.answered
        if answered is None:
            answers.append({"pid": call.pid, "error": call.error or "no answer in time", "sent": call.sent})
            continue
        hello, reply, payload = answered
        if offset + len(payload) > MAX_RELAYED_BYTES:
            too_big = f"its reply would take the relay past {MAX_RELAYED_BYTES} bytes"
            answers.append({"pid": call.pid, "error": too_big, "sent": True})
            continue
        where = {"offset": offset, "size": len(payload)}
        answers.append(dict(where, pid=call.pid, hello=hello, reply=reply))
        chunks.append(payload)
        offset += len(payload)
    return {"replies": answers}, chunks
