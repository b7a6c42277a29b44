"""Frames: `MAGIC | header length | payload length` (big-endian u32s), a UTF-8 JSON header,
then an optional binary payload; sending them in few system calls and reading them within
bounds of bytes and time.

Runs inside the target: standard library only, Python 3.8 syntax.
"""

from __future__ import annotations

import struct

from ..originals import json_dumps as _json_dumps
from ..originals import json_loads as json_loads
from ..originals import monotonic

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Union

    ByteChunk = Union[bytes, bytearray, memoryview]

MAGIC = b"PRB1"
PREFIX = struct.Struct(">4sII")

# A header is a small JSON object; anything bigger is a bug or an attack.
MAX_HEADER_BYTES = 1 << 20
# What the agent accepts from a client in one frame (eval code, parameters).
MAX_REQUEST_BYTES = 16 << 20
# What the CLI accepts from an agent in one frame (a 1 M-row table is ~100 MB). The CLI's
# memory grows only with the bytes that actually arrive, never with the announced length.
MAX_REPLY_BYTES = 1 << 30


class FrameError(Exception):
    """A frame that cannot be used. `fatal` when the byte stream can no longer be trusted."""

    def __init__(self, message: str, fatal: bool, request_id: Any = None) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.request_id = request_id


class ConnectionClosed(Exception):
    """The peer closed the connection in the middle of a frame."""


class Frame:
    __slots__ = ("header", "payload")

    def __init__(self, header: Dict[str, Any], payload: bytearray) -> None:
        self.header = header
        self.payload = payload


def json_dumps(value: Any) -> str:
    """A header's JSON: compact and ASCII; what JSON cannot hold is written as its str()."""
    return _json_dumps(value, compact=True)


def encode_header(header: Dict[str, Any]) -> bytes:
    return json_dumps(header).encode("utf-8")


# Frames above this size go out through sendmsg() from their chunks instead of being joined.
_JOIN_LIMIT = 1 << 20
_IOV_MAX = 512


def frame_buffers(header: Dict[str, Any], payload: Sequence[ByteChunk] = ()) -> List[ByteChunk]:
    header_bytes = encode_header(header)
    payload_length = sum(len(chunk) for chunk in payload)
    return [PREFIX.pack(MAGIC, len(header_bytes), payload_length) + header_bytes, *payload]


def send_buffers(sock: Any, buffers: Sequence[ByteChunk]) -> None:
    """Send buffers in as few system calls as the kernel allows: one, for a typical frame.

    Each socket call releases the GIL, and getting it back from a thread busy in Python can
    take a whole switch interval (5 ms); a reply sent chunk by chunk cost the agent tens of
    milliseconds in a busy process.
    """
    total = sum(len(buffer) for buffer in buffers)
    if total <= _JOIN_LIMIT or not hasattr(sock, "sendmsg"):
        sock.sendall(b"".join(buffers))
        return
    send_views(sock.sendmsg, [memoryview(buffer).cast("B") for buffer in buffers if len(buffer)])


def send_views(sendmsg: Callable[[List[memoryview]], int], views: List[memoryview]) -> None:
    """Every byte of `views` through `sendmsg`, IOV_MAX views at a time, however much each call
    takes (a blocking sendmsg may send part when a timeout or a signal cuts it short)."""
    while views:
        sent = sendmsg(views[:_IOV_MAX])
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


def send_frame(sock: Any, header: Dict[str, Any], payload: Sequence[ByteChunk] = ()) -> None:
    send_buffers(sock, frame_buffers(header, payload))


class FrameTimeout(FrameError):
    """A deadline passed before a frame arrived whole (a silent or a slowloris peer)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, fatal=True)


class FrameReader:
    """Reads frames from a stream socket.

    With read-ahead it asks for up to 64 KiB at a time, so a request (or a hello and a
    request sent together) costs one recv(): fewer GIL round trips, as in send_buffers.

    Memory grows as bytes arrive, never from what a frame announces: a peer that announces
    16 MB and sends ten bytes costs ten bytes (a buffer of the announced size, zero-filled
    up front, made every such connection cost the job 16 MB of RSS).

    `read` can bound time as well as bytes (the agent's defence against silent and slow
    peers): `deadline` is when the whole frame must have arrived, `frame_time` how long a
    frame may take once its first byte is in. Without them only the socket's own timeout
    applies, as the client wants.
    """

    CHUNK = 1 << 16
    # The most one recv() asks for: the kernel hands over what it has, and only that much
    # becomes resident, but there is no point in asking a socket for more at once.
    MAX_RECV = 1 << 20

    def __init__(self, sock: Any, max_bytes: int, readahead: bool = True) -> None:
        self.sock = sock
        self.max_bytes = max_bytes
        self.readahead = readahead
        self.pending = bytearray()
        # Per read(): the deadlines in force and the socket timeout to fall back to.
        self._deadline: Optional[float] = None
        self._frame_time: Optional[float] = None
        self._frame_deadline: Optional[float] = None
        self._idle_timeout: Optional[float] = None
        self._timeout_set: Any = None
        self._received = 0

    def _recv(self, size: int) -> bytes:
        limit = self._deadline
        frame_deadline = self._frame_deadline
        if frame_deadline is not None and (limit is None or frame_deadline < limit):
            limit = frame_deadline
        if limit is None:
            if self._timeout_set is not None:  # a deadline of this read() changed it: put it back
                self.sock.settimeout(self._idle_timeout)
                self._timeout_set = None
            return self._recv_counted(size)
        import _socket

        # Never zero: a thread that waited for the GIL past the deadline still takes bytes
        # that are already there.
        wait = max(limit - monotonic(), 0.001)
        idle = self._idle_timeout
        bounded_by_deadline = idle is None or wait < idle
        timeout = wait if bounded_by_deadline else idle
        if timeout != self._timeout_set:
            self.sock.settimeout(timeout)
            self._timeout_set = timeout
        try:
            return self._recv_counted(size)
        except _socket.timeout:
            if not bounded_by_deadline:
                raise
            if limit is self._frame_deadline:
                raise FrameTimeout(
                    f"a frame was started but not finished within {self._frame_time:g} s "
                    f"({self._received} bytes arrived)"
                ) from None
            raise FrameTimeout(
                f"no complete request before the deadline ({self._received} bytes arrived)"
            ) from None

    def _recv_counted(self, size: int) -> bytes:
        chunk: bytes = self.sock.recv(size)
        if chunk and self._frame_time is not None and self._frame_deadline is None:
            self._frame_deadline = monotonic() + self._frame_time
        self._received += len(chunk)
        return chunk

    def _take(self, size: int, frame_start: bool = False) -> Optional[bytearray]:
        pending = self.pending
        if len(pending) >= size:
            data = pending[:size]
            del pending[:size]
            return data
        # The bytes of this frame collect in the buffer that holds what came before them, and
        # that buffer becomes the result: a large payload is never copied out of it again.
        buffer, self.pending = pending, bytearray()
        while len(buffer) < size:
            wanted = min(size - len(buffer), self.MAX_RECV)
            chunk = self._recv(max(wanted, self.CHUNK) if self.readahead else wanted)
            if not chunk:
                if frame_start and not buffer:
                    return None
                raise ConnectionClosed(f"connection closed after {len(buffer)} of {size} bytes")
            buffer += chunk
        if len(buffer) > size:
            self.pending = buffer[size:]
            del buffer[size:]
        return buffer

    def has_frame(self) -> bool:
        """Whether a whole frame is already buffered (the client pipelined its requests)."""
        pending = self.pending
        if len(pending) < PREFIX.size:
            return False
        _, header_length, payload_length = PREFIX.unpack_from(pending)
        return bool(len(pending) >= PREFIX.size + header_length + payload_length)

    def read(self, deadline: Optional[float] = None, frame_time: Optional[float] = None) -> Optional[Frame]:
        """The next frame; None when the peer closed cleanly between frames.

        Raises FrameError for a frame we refuse (fatal when its length fields cannot be
        trusted, so the rest of the stream is unreadable), FrameTimeout when `deadline` (a
        monotonic() value) or `frame_time` passes, and ConnectionClosed for a
        truncated frame.
        """
        if deadline is None and frame_time is None:
            return self._read()

        self._deadline, self._frame_time = deadline, frame_time
        self._frame_deadline = monotonic() + frame_time if frame_time is not None and self.pending else None
        self._idle_timeout, self._timeout_set, self._received = self.sock.gettimeout(), None, 0
        try:
            return self._read()
        finally:
            if self._timeout_set is not None:
                self.sock.settimeout(self._idle_timeout)
            self._deadline = self._frame_time = self._frame_deadline = None
            self._timeout_set = None

    def _read(self) -> Optional[Frame]:
        prefix = self._take(PREFIX.size, frame_start=True)
        if prefix is None:
            return None
        magic, header_length, payload_length = PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise FrameError("not a probing frame (bad magic bytes)", fatal=True)
        if header_length > MAX_HEADER_BYTES:
            raise FrameError(
                f"frame header of {header_length} bytes exceeds the cap of {MAX_HEADER_BYTES}",
                fatal=True,
            )
        if header_length + payload_length > self.max_bytes:
            raise FrameError(
                f"frame of {header_length + payload_length} bytes exceeds the cap of {self.max_bytes}",
                fatal=True,
            )
        header_bytes = self._take(header_length) or bytearray()
        payload = (self._take(payload_length) or bytearray()) if payload_length else bytearray()
        try:
            header = json_loads(header_bytes.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            raise FrameError(f"frame header is not valid JSON: {error}", fatal=False) from None
        if not isinstance(header, dict):
            raise FrameError("frame header is not a JSON object", fatal=False)
        return Frame(header, payload)


def recv_frame(sock: Any, max_bytes: int) -> Optional[Frame]:
    """One frame, reading nothing past it (for one-request conversations)."""
    return FrameReader(sock, max_bytes, readahead=False).read()
