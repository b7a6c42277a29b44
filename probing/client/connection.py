"""Talking to an agent: connect, say hello, make requests, enforce timeouts (discovery.py
finds its socket).

Never prints; failures are ProbingErrors that say what to do. Stays cheap to import, because
`probing PID backtrace` is timed against py-spy.
"""

from __future__ import annotations

import _socket
import time

from .. import __version__
from ..errors import (
    AgentTimeout,
    AgentUnreachable,
    BadReply,
    NoAgent,
    PermissionDenied,
)
from ..procfs import effective_uid
from ..protocol.frames import MAX_REPLY_BYTES, FrameError, frame_buffers, send_buffers
from ..protocol.messages import PROTOCOL_VERSION, parse_reply, request
from ..protocol.texts import quoted

# The `X as X` names are re-exported: cli/ imports them from here. TODO(lead, at merge): import
# them from discovery and replies in the engine/CLI branch's modules, then drop the re-exports.
from .discovery import no_log, require_process
from .replies import ReplyReader, check_result, error_from_reply, named_table, read_reply
from .trust import ExpectedPeer, check_peer, check_socket_file, expected_for_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    # Re-exported: cli/ names the log callback from here.
    from ..protocol.tables import DecodedTable
    from .discovery import Log as Log


# A target written as tcp://HOST:PORT (client/tcp.py; not imported for a Unix socket).
TCP_SCHEME = "tcp://"


class Client:
    """One connection to one agent (its Unix socket, or tcp://HOST:PORT). Use as a context manager.

    The hello goes out together with the first request, and both replies come back in one
    read: a command costs one round trip.
    """

    def __init__(
        self,
        path: str,
        timeout: float,
        log: Log = no_log,
        pid: Optional[int] = None,
        stuck: Optional[Callable[[], Optional[str]]] = None,
    ) -> None:
        """Connect to the agent at `path`: the agent of process `pid` (as this side sees it),
        or, without a pid, whatever process the socket's name and owner say (see trust.py).
        Nothing is sent before the socket and the process answering on it are checked.
        A `path` of tcp://HOST:PORT is a remote agent: the token handshake stands in for the checks.
        `stuck`, asked while the agent's queue of connections stays full, says why waiting
        for room is pointless (or None to wait on)."""
        self._stuck = stuck
        self.path = path
        self.timeout = timeout
        self.log = log
        self.info: Dict[str, Any] = {}
        self._greeting = False
        self._next_id = 0
        self._started = time.perf_counter()
        if path.startswith(TCP_SCHEME):
            # Over TCP the handshake proves the peer knows the job's token: there is no
            # process or socket owner to check.
            from .tcp import open_authenticated

            self._sock = open_authenticated(path, timeout, log)
            self._reader = ReplyReader(self._sock, MAX_REPLY_BYTES)
            return
        if pid is None:
            path, expected = expected_for_path(path)
        else:
            uid = effective_uid(pid)
            if uid is None:
                require_process(pid)
                raise PermissionDenied(f"cannot read the owner of PID {pid}")
            expected = ExpectedPeer(pid, None, uid, f"PID {pid}")
            check_socket_file(path, uid, expected.why)
        self._sock = self._connect(path, timeout)
        self._reader = ReplyReader(self._sock, MAX_REPLY_BYTES)
        try:
            peer_pid, peer_uid = check_peer(self._sock, path, expected)
        except BaseException:
            self.close()
            raise
        log(f"{path}: answered by PID {peer_pid}, uid {peer_uid}")

    def _connect(self, path: str, timeout: float) -> Any:
        # _socket rather than socket: the socket module imports enum and selectors, a few ms
        # of start-up that `probing PID backtrace` cannot afford.
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                sock.connect(path)
                return sock
            except BlockingIOError:
                # EAGAIN: the agent's listen backlog is full (a storm of connections). A Unix
                # socket with a timeout does not wait for room, so wait here, within our time.
                sock.close()
                if pause == 0.001:
                    self.log(f"{path}: the agent's queue of connections is full; trying again")
                why = self._stuck() if self._stuck is not None else None
                if why is not None:
                    raise AgentTimeout(f"the agent's queue of connections is full, and {why}") from None
                if time.monotonic() + pause >= deadline:
                    raise AgentTimeout(
                        f"the agent at {path} did not accept a connection in {timeout:g} s "
                        "(its queue of waiting connections stayed full)"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
            except FileNotFoundError:
                sock.close()
                raise NoAgent(f"no agent socket at {path}") from None
            except ConnectionRefusedError:
                sock.close()
                raise NoAgent(
                    f"nothing listens on {path} (left behind by a process that was killed?)"
                ) from None
            except PermissionError:
                sock.close()
                raise PermissionDenied(f"not allowed to connect to {path}") from None
            except _socket.timeout:
                sock.close()
                raise AgentTimeout(
                    f"the agent at {path} did not accept a connection in {timeout:g} s"
                ) from None
            except OSError as error:
                sock.close()
                raise AgentUnreachable(f"cannot connect to {path}: {error.strerror or error}") from None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        sock = getattr(self, "_sock", None)
        if sock is None:
            return
        try:
            sock.close()
        except OSError:
            pass

    def _request(self, method: str, params: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        self._next_id += 1
        return request(self._next_id, method, params)

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
            hello = {"protocol": PROTOCOL_VERSION, "client": __version__}
            buffers += frame_buffers(self._request("hello", hello))
        buffers += frame_buffers(self._request(method, params))
        try:
            send_buffers(self._sock, buffers)
        except (ConnectionResetError, BrokenPipeError):
            raise AgentUnreachable(f"the agent closed the connection before {method!r}") from None
        except OSError as error:  # over TCP: a peer that stopped reading, a network gone
            raise AgentUnreachable(
                f"cannot send {method!r} to {self.path}: {error.strerror or error}"
            ) from None

    def answered(self, timeout: float) -> bool:
        """Whether the agent's reply starts arriving within `timeout` seconds."""
        import select

        # Over TCP, bytes already taken off the socket (a sealed record read whole) count too.
        pending = getattr(self._sock, "pending", None)
        if pending is not None and pending():
            return True
        # poll, not select: a command over a thousand ranks holds descriptors past select's 1 024.
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        return bool(poller.poll(max(0.0, timeout) * 1000))

    def receive(self, method: str, timeout: Optional[float] = None) -> Tuple[Any, bytearray]:
        wait = self.timeout if timeout is None else timeout
        if self._greeting:
            try:
                self.info, _ = self._receive("hello", wait, self._next_id - 1)
            except AgentTimeout as error:
                # The hello's reply leaves with the first request's, in one send (agent/server.py):
                # what was not answered in time is the request.
                late = f"the agent did not answer {method!r} within {wait:g} s"
                raise AgentTimeout(late, hint=error.hint) from None
            self._greeting = False
            self.log(
                f"connected in {(time.perf_counter() - self._started) * 1000:.1f} ms: "
                f"pid {self.info.get('pid')}, Python {self.info.get('python_version')}, "
                f"agent {self.info.get('probing_version')}"
            )
        return self._receive(method, wait, self._next_id)

    def _receive(self, method: str, wait: float, request_id: int) -> Tuple[Any, bytearray]:
        frame = read_reply(self._reader, method, wait)
        try:
            reply_id, ok, body = parse_reply(frame.header)
        except FrameError as error:
            raise BadReply(f"unusable reply to {method!r}: {error}") from None
        # The agent refuses a connection (busy, not allowed) before reading a request: id null.
        if reply_id != request_id and (ok or reply_id is not None):
            raise BadReply(f"the reply to {method!r} answers request {quoted(reply_id)}, not {request_id}")
        if not ok:
            raise error_from_reply(body, frame.payload)
        return check_result(method, body), frame.payload

    def fetch_table(
        self, name: str, params: Optional[Dict[str, Any]] = None, timeout: Optional[float] = None
    ) -> DecodedTable:
        result, payload = self.call("table", dict(params or {}, name=name), timeout)
        return named_table(name, result, payload)

    def describe_tables(self) -> List[Dict[str, Any]]:
        result, _ = self.call("tables")
        tables: List[Dict[str, Any]] = result["tables"]
        return tables
