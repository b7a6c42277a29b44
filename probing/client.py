"""Talking to an agent: find its socket, say hello, make requests, enforce timeouts.

Never prints; failures are ProbingErrors that say what to do. Stays cheap to import, because
`probing PID backtrace` is timed against py-spy.
"""

from __future__ import annotations

import _socket
import os
import time

from . import __version__, protocol
from .errors import (
    AgentTimeout,
    AgentUnreachable,
    EvalTimedOut,
    NoAgent,
    NoTorch,
    NotPython,
    PermissionDenied,
    ProbingError,
    RemoteError,
    SessionGone,
)
from .processes import python_version_of, require_process, socket_candidates

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    Log = Callable[[str], None]

START_AGENT_HINT = (
    "drop --no-attach to attach to it, or start the job with the agent: "
    "`probing run -- python train.py` or `PROBING=1 python train.py`"
)


def _no_log(message: str) -> None:
    pass


def locate_socket(pid: int, log: Log = _no_log) -> str:
    """The socket of the agent in `pid`, or the ProbingError that says why there is none."""
    require_process(pid)
    candidates = socket_candidates(pid)
    denied = None
    for path in candidates:
        try:
            os.stat(path)
        except FileNotFoundError:
            log(f"no socket at {path}")
            continue
        except PermissionError:
            log(f"not allowed to look at {path}")
            denied = path
            continue
        log(f"agent socket: {path}")
        return path
    version = python_version_of(pid)
    if version is None:
        raise NotPython(f"PID {pid} is not a Python process")
    if denied is not None:
        raise PermissionDenied(
            f"not allowed to reach the agent of PID {pid} ({denied})",
            hint="run probing as the user that owns the process, or as root",
        )
    raise NoAgent(f"PID {pid} (Python {version}) has no probing agent", hint=START_AGENT_HINT)


class Client:
    """One connection to one agent. Use as a context manager.

    The hello goes out together with the first request, and both replies come back in one
    read: a command costs one round trip.
    """

    def __init__(self, path: str, timeout: float, log: Log = _no_log) -> None:
        self.path = path
        self.timeout = timeout
        self.log = log
        self.info: Dict[str, Any] = {}
        self._greeting = False
        self._next_id = 0
        self._started = time.perf_counter()
        # _socket rather than socket: the socket module imports enum and selectors, a few ms
        # of start-up that `probing PID backtrace` cannot afford.
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self._reader = protocol.FrameReader(self._sock, protocol.MAX_REPLY_BYTES)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
        except FileNotFoundError:
            self.close()
            raise NoAgent(f"no agent socket at {path}", hint=START_AGENT_HINT) from None
        except ConnectionRefusedError:
            self.close()
            raise NoAgent(
                f"nothing listens on {path} (left behind by a process that was killed?)",
                hint=START_AGENT_HINT,
            ) from None
        except PermissionError:
            self.close()
            raise PermissionDenied(
                f"not allowed to connect to {path}",
                hint="run probing as the user that owns the process, or as root",
            ) from None
        except _socket.timeout:
            self.close()
            raise AgentTimeout(f"the agent at {path} did not accept a connection in {timeout:g} s") from None
        except OSError as error:
            self.close()
            raise AgentUnreachable(f"cannot connect to {path}: {error.strerror or error}") from None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    def _request(self, method: str, params: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        self._next_id += 1
        return protocol.request(self._next_id, method, params)

    def call(
        self, method: str, params: Optional[Dict[str, Any]] = None, timeout: Optional[float] = None
    ) -> Tuple[Any, bytearray]:
        """Send one request; returns (result, payload) or raises the error the agent replied."""
        self.send(method, params)
        return self.receive(method, timeout)

    def send(self, method: str, params: Optional[Dict[str, Any]] = None) -> None:
        """Send a request (with the hello in front of the first); `receive` gets the reply."""
        buffers = []
        self._greeting = not self.info
        if self._greeting:
            hello = {"protocol": protocol.PROTOCOL_VERSION, "client": __version__}
            buffers += protocol.frame_buffers(self._request("hello", hello))
        buffers += protocol.frame_buffers(self._request(method, params))
        try:
            protocol.send_buffers(self._sock, buffers)
        except (ConnectionResetError, BrokenPipeError):
            raise AgentUnreachable(f"the agent closed the connection before {method!r}") from None

    def answered(self, timeout: float) -> bool:
        """Whether the agent's reply starts arriving within `timeout` seconds."""
        import select

        return bool(select.select([self._sock], [], [], max(0.0, timeout))[0])

    def receive(self, method: str, timeout: Optional[float] = None) -> Tuple[Any, bytearray]:
        wait = self.timeout if timeout is None else timeout
        self._sock.settimeout(wait)
        try:
            if self._greeting:
                self.info, _ = self._receive("hello", wait)
                self._greeting = False
                self.log(
                    f"connected in {(time.perf_counter() - self._started) * 1000:.1f} ms: "
                    f"pid {self.info.get('pid')}, Python {self.info.get('python_version')}, "
                    f"agent {self.info.get('probing_version')}"
                )
            return self._receive(method, wait)
        except (ConnectionResetError, BrokenPipeError):
            raise AgentUnreachable(
                f"the agent closed the connection during {method!r} (did the process exit?)"
            ) from None

    def _receive(self, method: str, wait: float) -> Tuple[Any, bytearray]:
        try:
            frame = self._reader.read()
        except _socket.timeout:
            raise AgentTimeout(
                f"the agent did not answer {method!r} within {wait:g} s",
                hint="the process may be holding the GIL in native code; "
                "`py-spy dump --pid PID` reads its stacks from outside",
            ) from None
        except (protocol.ConnectionClosed, ConnectionResetError):
            frame = None
        except protocol.FrameError as error:
            raise AgentUnreachable(f"unreadable reply from the agent: {error}") from None
        if frame is None:
            raise AgentUnreachable(
                f"the agent closed the connection during {method!r} (did the process exit?)"
            )
        _, ok, body = protocol.parse_reply(frame.header)
        if not ok:
            raise error_from_reply(body, frame.payload)
        return body, frame.payload

    def fetch_table(
        self, name: str, params: Optional[Dict[str, Any]] = None, timeout: Optional[float] = None
    ) -> protocol.DecodedTable:
        result, payload = self.call("table", dict(params or {}, name=name), timeout)
        return protocol.decode_table(result["table"], payload)

    def describe_tables(self) -> List[Dict[str, Any]]:
        result, _ = self.call("tables")
        tables: List[Dict[str, Any]] = result["tables"]
        return tables


def error_from_reply(error: Dict[str, Any], payload: protocol.ByteChunk = b"") -> ProbingError:
    kind, message = error.get("type"), error["message"]
    if "texts" in error:  # eval's output and traceback travel in the payload
        try:
            error = dict(error, **protocol.decode_texts(error["texts"], payload))
        except protocol.FrameError as bad:
            return AgentUnreachable(f"unreadable reply from the agent: {bad}")
    if kind == "Busy":
        # Every connection of the agent runs a request: the message names them. backtrace
        # falls back on this, and says why.
        return AgentUnreachable(message, hint="try again when one of those requests has ended")
    if kind == "RemoteError":
        return RemoteError(
            message,
            traceback=error.get("traceback", ""),
            stdout=error.get("stdout", ""),
            stderr=error.get("stderr", ""),
        )
    if kind == "EvalTimeout":
        return EvalTimedOut(message, stdout=error.get("stdout", ""), stderr=error.get("stderr", ""))
    if kind == "PermissionDenied":
        return PermissionDenied(message, hint="run probing as the user that owns the process, or as root")
    if kind == "ProtocolMismatch":
        return AgentUnreachable(message, hint="use the same probing version for the CLI and the job")
    if kind == "NoTorch":
        return NoTorch(
            message, hint="torch features work once the job has imported torch; "
            "PROBING=1 PROBING_TORCH_TRACE=1 python train.py traces from the first step",
        )  # fmt: skip
    if kind == "NoCuda":
        return NoTorch(message, hint="the job keeps its tensors on the CPU: see `probing PID memory`")
    if kind == "NoSession":
        return SessionGone(message)
    if kind == "InternalError":
        return ProbingError(f"the agent failed: {message}", hint="this is a bug in probing; please report it")
    return ProbingError(message)
