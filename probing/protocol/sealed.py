"""Sealed records: every byte of an authenticated TCP connection, in both directions, carries a
MAC under that connection's session key (auth.session_key), so that a relay that passed the
handshake along can neither add, change, replay, reorder, reflect nor drop a byte unnoticed.

    record = length (u32, big-endian, 1 to MAX_RECORD_BYTES) + data
             + HMAC-SHA256(session key, direction + sequence (u64) + length + data)

Each direction counts its own records from 0 and has its own label, so a record sent back to
its sender, or taken from another place in the stream, fails its check. A failed check, a length
over the cap, or an end of stream inside a record is fatal: RecordError (a ConnectionError, so
every `except OSError` that ends a broken connection ends this one too), raised again on every
later call. Nothing is encrypted: the data travels readable.

SealedSocket is the socket itself (the same descriptor, taken over from the handshake's socket
object) with recv, recv_into, send, sendall and sendmsg sealing and opening records, so the frame
code, timeouts, shutdown, close and detach work on it unchanged. A recv returns plaintext only
from records that passed their check; a recv that times out in the middle of a record keeps
what arrived for the next call.

Standard library only, Python 3.8 syntax: the agent imports it.
"""

from __future__ import annotations

import struct
import sys
from _operator import _compare_digest as compare_digest
from _socket import MSG_PEEK

from ..originals import Socket, monotonic, socket_timeout
from .auth import MAC_BYTES, HmacSha256
from .frames import send_views

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, List, Optional, Union

    Vector = Union[bytes, memoryview]

LENGTH = struct.Struct(">I")
SEQUENCE = struct.Struct(">Q")
# A record's data, at most: what the receiver buffers before it can check anything.
MAX_RECORD_BYTES = 1 << 20
OVERHEAD_BYTES = LENGTH.size + MAC_BYTES
AGENT = "agent"
CLIENT = "client"
_TO_CLIENT = b"probing record, agent to client\x00"
_TO_AGENT = b"probing record, client to agent\x00"
# Reads ask for at least this much: small records (a request, a short reply) cost one recv.
_READ_AHEAD = 1 << 16
# Records go out in batches of about this size: the peer checks one batch while we seal the next.
_SEND_BATCH = 4 << 20
# Below this, a batch is joined and sent in one sendall() rather than through sendmsg().
_JOIN_LIMIT = 1 << 16


def loaded_openssl_sha256() -> Optional[Callable[[bytes], Any]]:
    """OpenSSL's SHA-256 if this process has loaded it already (a job that imported torch has),
    else None: the built-in one of auth.py. OpenSSL's runs ~6x faster here (1.2 GB/s against
    0.19 GB/s) and releases the GIL while it hashes, but loading it would cost a rank that has
    not ~3.6 MB, so the agent never loads it itself."""
    module = sys.modules.get("_hashlib")
    sha256: Optional[Callable[[bytes], Any]] = getattr(module, "openssl_sha256", None)
    return sha256


class RecordError(ConnectionError):
    """A record failed its check, announced too many bytes, or the stream ended inside one:
    the connection cannot be trusted any more. `truncated` for the end of stream."""

    def __init__(self, message: str, truncated: bool = False) -> None:
        super().__init__(message)
        self.truncated = truncated


class SealedSocket(Socket):
    """An authenticated connection whose bytes travel in sealed records (module docstring).

    `failure`, when given, turns a RecordError into the exception to raise instead (the CLI's
    own error with the endpoint in it); without it the RecordError itself is raised. `sha256`:
    the implementation to MAC with (default: loaded_openssl_sha256()).
    """

    __slots__ = (
        "_mac",
        "_send_label",
        "_recv_label",
        "_sent",
        "_received",
        "_raw",
        "_plain",
        "_at",
        "_failed",
        "_failure",
    )

    def __init__(
        self,
        raw: Socket,
        session_key: bytes,
        side: str,
        failure: Optional[Callable[[RecordError], BaseException]] = None,
        sha256: Optional[Callable[[bytes], Any]] = None,
    ) -> None:
        if side not in (AGENT, CLIENT):
            raise ValueError(f"side is {AGENT!r} or {CLIENT!r}, not {side!r}")
        timeout = raw.gettimeout()
        super().__init__(raw.family, raw.type, raw.proto, raw.detach())
        # A socket made from a descriptor takes the default timeout, not the old object's.
        self.settimeout(timeout)
        self._mac = HmacSha256(session_key, sha256 or loaded_openssl_sha256())
        agent = side == AGENT
        self._send_label = _TO_CLIENT if agent else _TO_AGENT
        self._recv_label = _TO_AGENT if agent else _TO_CLIENT
        self._sent = 0  # records sent: the sequence number of the next
        self._received = 0  # records opened
        self._raw = bytearray()  # bytes received that make no whole record yet
        self._plain = b""  # the data of the record being read, from _at on
        self._at = 0
        self._failed: Optional[RecordError] = None
        self._failure = failure

    # The C socket type (originals.Socket, what the agent runs on) is no context manager.
    def __enter__(self) -> SealedSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- receiving ---------------------------------------------------------------------------

    def pending(self) -> int:
        """Bytes received and not yet handed out (checked or not): a reader with pending bytes
        has something to read even when select() says the socket has nothing new."""
        return len(self._plain) - self._at + len(self._raw)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        """Up to `bufsize` bytes of checked data; b"" only when the peer closed between records.

        With MSG_PEEK it never waits for the rest of a record: it returns checked data if some
        is there (after opening the whole records that have arrived), b"" if the peer closed,
        and raises BlockingIOError while a record is still on its way."""
        if flags & ~MSG_PEEK:
            raise ValueError("a sealed socket takes no recv flags other than MSG_PEEK")
        self._raise_if_failed()
        if bufsize < 0:
            raise ValueError("negative buffersize in recv")
        if flags:
            return self._peek(bufsize)
        if self._at >= len(self._plain):
            if bufsize == 0 or not self._open_next():
                return b""
        plain, start = self._plain, self._at
        if start == 0 and bufsize >= len(plain):
            self._plain = b""
            return plain
        data = plain[start : start + bufsize]
        self._at = start + len(data)
        if self._at >= len(plain):
            self._plain, self._at = b"", 0
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        with memoryview(buffer) as view, view.cast("B") as target:
            data = self.recv(nbytes or len(target), flags)
            target[: len(data)] = data
        return len(data)

    def _peek(self, bufsize: int) -> bytes:
        if self._at >= len(self._plain) and not self._open_buffered():
            timeout = self.gettimeout()
            super().settimeout(0.0)  # take what has arrived, wait for nothing
            try:
                while True:
                    chunk = super().recv(_READ_AHEAD)  # BlockingIOError: a record is on its way
                    if not chunk:
                        if self._raw:
                            raise self._fail(
                                RecordError("the connection ended inside a record", truncated=True)
                            )
                        return b""
                    self._raw += chunk
                    if self._open_buffered():
                        break
            finally:
                super().settimeout(timeout)
        return self._plain[self._at : self._at + bufsize]

    def _open_next(self) -> bool:
        """Read until a record with data is open; False at a clean end of stream."""
        timeout = self.gettimeout()
        deadline = monotonic() + timeout if timeout else None
        first = True
        try:
            while not self._open_buffered():
                if not first and deadline is not None:
                    # The caller's timeout bounds the whole call, not each recv: a peer that
                    # drips a record byte by byte must not hold the reader longer than it.
                    left = deadline - monotonic()
                    if left <= 0:
                        raise socket_timeout("timed out")
                    super().settimeout(left)
                first = False
                need = self._bytes_missing()
                chunk = super().recv(max(need, _READ_AHEAD))
                if not chunk:
                    if self._raw:
                        raise self._fail(RecordError("the connection ended inside a record", truncated=True))
                    return False
                self._raw += chunk
        finally:
            if not first and deadline is not None:
                super().settimeout(timeout)
        return True

    def _bytes_missing(self) -> int:
        raw = self._raw
        if len(raw) < LENGTH.size:
            return LENGTH.size - len(raw)
        length: int = LENGTH.unpack_from(raw)[0]
        return LENGTH.size + length + MAC_BYTES - len(raw)

    def _open_buffered(self) -> bool:
        """Open the whole records already received until one has data; whether one had."""
        raw = self._raw
        while len(raw) >= LENGTH.size:
            length: int = LENGTH.unpack_from(raw)[0]
            if length > MAX_RECORD_BYTES:
                raise self._fail(
                    RecordError(
                        f"a record announced {length} bytes, more than the {MAX_RECORD_BYTES} allowed"
                    )
                )
            end = LENGTH.size + length + MAC_BYTES
            if len(raw) < end:
                return False
            sequence = SEQUENCE.pack(self._received)
            with memoryview(raw) as view:
                expected = self._mac.digest((self._recv_label, sequence, view[: LENGTH.size + length]))
                if not compare_digest(expected, view[LENGTH.size + length : end]):
                    raise self._fail(RecordError("a record failed its check"))
                data = bytes(view[LENGTH.size : LENGTH.size + length])
            del raw[:end]
            self._received += 1
            if data:
                self._plain, self._at = data, 0
                return True
        return False

    # --- sending -----------------------------------------------------------------------------

    def sendall(self, data: Any, flags: int = 0) -> None:
        if flags:
            raise ValueError("a sealed socket takes no send flags")
        self._send_sealed((data,))

    def send(self, data: Any, flags: int = 0) -> int:
        """Sends all of `data` (as sealed records cannot be sent in part)."""
        if flags:
            raise ValueError("a sealed socket takes no send flags")
        return self._send_sealed((data,))

    def sendmsg(
        self, buffers: Iterable[Any], ancdata: Iterable[Any] = (), flags: int = 0, address: Any = None
    ) -> int:
        """Sends all of `buffers` (frames.send_buffers' large frames), sealed, without joining
        them: a record's data goes out from the caller's buffers."""
        if list(ancdata) or flags or address is not None:
            raise ValueError("a sealed socket sends data only")
        return self._send_sealed(buffers)

    def _send_sealed(self, buffers: Iterable[Any]) -> int:
        self._raise_if_failed()
        total = 0
        batch: List[Vector] = []
        batch_bytes = 0
        record: List[memoryview] = []
        record_bytes = 0
        for buffer in buffers:
            view = memoryview(buffer).cast("B")
            total += len(view)
            while len(view):
                piece = view[: MAX_RECORD_BYTES - record_bytes]
                view = view[len(piece) :]
                record.append(piece)
                record_bytes += len(piece)
                if record_bytes == MAX_RECORD_BYTES:
                    batch += self._seal(record, record_bytes)
                    batch_bytes += record_bytes
                    record, record_bytes = [], 0
                    if batch_bytes >= _SEND_BATCH:
                        self._send_vectors(batch)
                        batch, batch_bytes = [], 0
        if record_bytes:
            batch += self._seal(record, record_bytes)
        if batch:
            self._send_vectors(batch)
        return total

    def _seal(self, pieces: List[memoryview], length: int) -> List[Vector]:
        header = LENGTH.pack(length)
        mac = self._mac.digest([self._send_label, SEQUENCE.pack(self._sent), header, *pieces])
        self._sent += 1
        return [header, *pieces, mac]

    def _send_vectors(self, vectors: List[Vector]) -> None:
        if sum(len(vector) for vector in vectors) <= _JOIN_LIMIT:
            super().sendall(b"".join(vectors))
            return
        send_views(super().sendmsg, [memoryview(vector) for vector in vectors])

    # --- failure -----------------------------------------------------------------------------

    def _fail(self, error: RecordError) -> BaseException:
        self._failed = error
        self._raw = bytearray()
        self._plain, self._at = b"", 0
        return error if self._failure is None else self._failure(error)

    def _raise_if_failed(self) -> None:
        failed = self._failed
        if failed is not None:
            raise failed if self._failure is None else self._failure(failed)
