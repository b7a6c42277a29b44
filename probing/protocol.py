"""The wire format: the one module both the CLI and the agent import.

A frame is `MAGIC | header length | payload length` (big-endian u32s), a UTF-8 JSON header,
then an optional binary payload. Requests are `{id, method, params}`; replies are
`{id, ok: true, result}` or `{id, ok: false, error: {type, message, ...}}`. Tables travel as
typed columns in the payload (see `encode_table`), so shipping a table costs the agent a few
`array.tobytes()` calls rather than a per-row serialisation under the target's GIL.

Runs inside the target: standard library only, Python 3.8 syntax.
"""

from __future__ import annotations

import struct
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

    ByteChunk = Union[bytes, bytearray, memoryview]

PROTOCOL_VERSION = 1
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


def _json_codec() -> Tuple[Callable[[Any], str], Callable[[str], Any]]:
    """JSON through the C accelerator `_json` directly.

    `import json` drags in `re` and `enum`, ~8 ms of the CLI's start-up on every
    `probing PID backtrace`; `_json` holds the same C encoder and scanner that json uses.
    Any interpreter where that does not work gets the json module.
    """
    try:
        import _json

        class Options:
            strict = True
            object_hook = object_pairs_hook = None
            parse_float = parse_constant = float
            parse_int = int
            memo: Dict[Any, Any] = {}

        scan = _json.make_scanner(Options())  # type: ignore[arg-type]
        encoder = _json.make_encoder(
            None, str, _json.encode_basestring_ascii, None, ":", ",", False, False, True
        )

        def dumps(value: Any) -> str:
            return "".join(encoder(value, 0))

        def loads(text: str) -> Any:
            text = text.strip()
            try:
                value, end = scan(text, 0)
            except StopIteration:
                raise ValueError("expecting a JSON value") from None
            if end != len(text):
                raise ValueError(f"extra data at character {end}")
            return value

        if loads(dumps({"a": [1, 2.5, None, True, "\u00e9"]})) != {"a": [1, 2.5, None, True, "\u00e9"]}:
            raise ValueError("_json round trip failed")
        return dumps, loads
    except Exception:  # noqa: BLE001 - any surprise: the plain module does the same job
        import json

        return (lambda value: json.dumps(value, separators=(",", ":"), default=str)), json.loads


json_dumps, json_loads = _json_codec()


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
    views = [memoryview(buffer).cast("B") for buffer in buffers if len(buffer)]
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
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
        from time import monotonic

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
            from time import monotonic

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
        time.monotonic() value) or `frame_time` passes, and ConnectionClosed for a
        truncated frame.
        """
        if deadline is None and frame_time is None:
            return self._read()
        from time import monotonic

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


def encode_texts(texts: Dict[str, Optional[str]]) -> Tuple[Dict[str, Any], List[ByteChunk]]:
    """Texts (what an eval printed, its value, its traceback) as UTF-8 in the payload.

    Returns ({name: [offset, length] or None}, chunks). Output travels outside the JSON
    header because the header is capped (MAX_HEADER_BYTES) and JSON escapes every non-ASCII
    character to six bytes: 1.1 MB of print() output used to fail the whole command.
    """
    layout: Dict[str, Any] = {}
    chunks: List[ByteChunk] = []
    offset = 0
    for name, text in texts.items():
        if text is None:
            layout[name] = None
            continue
        # A lone surrogate (from a bad decode in the job) must not fail the reply.
        data = text.encode("utf-8", "backslashreplace")
        layout[name] = [offset, len(data)]
        if data:
            chunks.append(data)
        offset += len(data)
    return layout, chunks


def decode_texts(layout: Any, payload: ByteChunk) -> Dict[str, Optional[str]]:
    """Inverse of `encode_texts`; raises FrameError on a layout that does not fit the payload."""
    if not isinstance(layout, dict):
        raise FrameError("reply texts are not an object", fatal=False)
    view = memoryview(payload)
    texts: Dict[str, Optional[str]] = {}
    for name, place in layout.items():
        if place is None:
            texts[name] = None
            continue
        if (
            not isinstance(place, list)
            or len(place) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in place)
            or place[0] + place[1] > len(view)
        ):
            raise FrameError(f"reply text {name!r} does not fit the payload", fatal=False)
        texts[name] = bytes(view[place[0] : place[0] + place[1]]).decode("utf-8", "replace")
    return texts


def parse_request(header: Dict[str, Any]) -> Tuple[Any, str, Dict[str, Any]]:
    """Check a request header against the schema; returns (id, method, params)."""
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, (int, str)):
        raise FrameError("request 'id' must be an integer or a string", fatal=False)
    method = header.get("method")
    if not isinstance(method, str) or not method:
        raise FrameError("request has no 'method' string", fatal=False, request_id=request_id)
    params = header.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise FrameError("request 'params' must be an object", fatal=False, request_id=request_id)
    return request_id, method, params


def request(request_id: Any, method: str, params: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return {"id": request_id, "method": method, "params": params or {}}


def ok_reply(request_id: Any, result: Any) -> Dict[str, Any]:
    return {"id": request_id, "ok": True, "result": result}


def error_reply(request_id: Any, error_type: str, message: str, **details: Any) -> Dict[str, Any]:
    error = {"type": error_type, "message": message}
    error.update(details)
    return {"id": request_id, "ok": False, "error": error}


def parse_reply(header: Dict[str, Any]) -> Tuple[Any, bool, Any]:
    """Check a reply header against the schema; returns (id, ok, result-or-error)."""
    ok = header.get("ok")
    if not isinstance(ok, bool):
        raise FrameError("reply has no boolean 'ok'", fatal=False)
    if ok:
        return header.get("id"), True, header.get("result")
    error = header.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        raise FrameError("error reply has no 'error.message'", fatal=False)
    error.setdefault("type", "Error")
    return header.get("id"), False, error


# --- tables -------------------------------------------------------------------------------
#
# Column encodings (all arrays in the sender's byte order, named in the descriptor):
#   i64   int64 values, plus an optional int8 validity array (1 = value, 0 = NULL)
#   f64   float64 values, plus an optional validity array
#   bool  int8: 1, 0, or -1 for NULL
#   dict  int32 codes into a dictionary (-1 = NULL); the dictionary is a uint32 array of
#         UTF-8 byte lengths followed by the concatenated UTF-8 bytes
# Segments are padded to 8 bytes so the CLI can map them with numpy without copying.

ENCODING_OF_TYPE = {
    "BIGINT": "i64",
    "DOUBLE": "f64",
    "TIMESTAMP": "f64",  # seconds since the epoch, UTC
    "BOOLEAN": "bool",
    "VARCHAR": "dict",
    "JSON": "dict",  # JSON text
    "VARCHAR[]": "dict",  # a JSON array of strings
    "BIGINT[]": "dict",  # a JSON array of integers
}

TYPECODE_OF_ENCODING = {"i64": "q", "f64": "d", "bool": "b", "dict": "i"}


class ColumnBuffers:
    """One column as the sender hands it to `encode_table`.

    `data` and `valid` are one buffer or a list of buffers sent one after the other (the
    blocks of a ring buffer, sent without being joined).
    """

    __slots__ = ("name", "type", "data", "valid", "dictionary")

    def __init__(
        self,
        name: str,
        type: str,
        data: Union[ByteChunk, List[ByteChunk]],
        valid: Union[ByteChunk, List[ByteChunk], None],
        dictionary: Optional[Sequence[str]],
    ) -> None:
        self.name = name
        self.type = type
        self.data = data
        self.valid = valid
        self.dictionary = dictionary


class DecodedColumn:
    __slots__ = ("name", "type", "encoding", "data", "valid", "dictionary")

    def __init__(
        self,
        name: str,
        type: str,
        encoding: str,
        data: Sequence[Any],
        valid: Optional[Sequence[int]],
        dictionary: Optional[List[str]],
    ) -> None:
        self.name = name
        self.type = type
        self.encoding = encoding
        self.data = data
        self.valid = valid
        self.dictionary = dictionary

    def to_pylist(self) -> List[Any]:
        """The column as Python values, None for NULL."""
        if self.encoding == "dict":
            words = self.dictionary or []
            return [words[code] if code >= 0 else None for code in self.data]
        if self.encoding == "bool":
            return [None if value < 0 else bool(value) for value in self.data]
        values = list(self.data)
        if self.valid is not None:
            return [v if ok else None for v, ok in zip(values, self.valid)]
        return values


class DecodedTable:
    __slots__ = ("name", "rows", "columns", "notes")

    def __init__(self, name: str, rows: int, columns: List[DecodedColumn], notes: Sequence[str] = ()) -> None:
        self.name = name
        self.rows = rows
        self.columns = columns
        self.notes = list(notes)  # what the agent wants said, e.g. that a scan was cut short

    def column(self, name: str) -> DecodedColumn:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

    def to_rows(self) -> List[Dict[str, Any]]:
        names = [column.name for column in self.columns]
        values = [column.to_pylist() for column in self.columns]
        return [dict(zip(names, row)) for row in zip(*values)] if values else []


def _padding(length: int) -> bytes:
    return b"\0" * (-length % 8)


def encode_table(
    name: str, rows: int, columns: Sequence[ColumnBuffers]
) -> Tuple[Dict[str, Any], List[ByteChunk]]:
    """Lay columns out as payload chunks; returns (descriptor for the header, chunks)."""
    chunks: List[ByteChunk] = []
    offset = 0

    def add(chunk: Union[ByteChunk, List[ByteChunk]]) -> Tuple[int, int]:
        nonlocal offset
        parts = chunk if isinstance(chunk, list) else [chunk]
        start, length = offset, sum(len(part) for part in parts)
        chunks.extend(part for part in parts if len(part))
        pad = _padding(length)
        if pad:
            chunks.append(pad)
        offset += length + len(pad)
        return start, length

    described = []
    for column in columns:
        encoding = ENCODING_OF_TYPE[column.type]
        entry: Dict[str, Any] = {"name": column.name, "type": column.type, "encoding": encoding}
        entry["offset"], entry["length"] = add(column.data)
        if column.valid is not None:
            entry["valid_offset"], entry["valid_length"] = add(column.valid)
        if encoding == "dict":
            encoded = [word.encode("utf-8", "backslashreplace") for word in column.dictionary or ()]
            entry["dict_count"] = len(encoded)
            entry["dict_offset"], _ = add(struct.pack(f"={len(encoded)}I", *(len(b) for b in encoded)))
            entry["dict_bytes_offset"], entry["dict_bytes_length"] = add(b"".join(encoded))
        described.append(entry)
    descriptor = {"name": name, "rows": rows, "byteorder": sys.byteorder, "columns": described}
    return descriptor, chunks


def _typed(typecode: str, payload: memoryview, offset: int, length: int, swap: bool) -> Sequence[Any]:
    # memoryview.cast rather than array: importing array pulls in collections (~2 ms of CLI
    # start-up), and a view copies nothing, which matters for a million-row table.
    chunk = payload[offset : offset + length]
    if not swap:
        return chunk.cast(typecode)  # type: ignore[call-overload, no-any-return]
    import array

    values = array.array(typecode)
    values.frombytes(chunk)
    values.byteswap()
    return values


def _region(entry: Dict[str, Any], offset_key: str, length_key: str, size: int) -> Tuple[int, int]:
    """An (offset, length) pair of the descriptor, checked to lie inside the payload."""
    offset, length = entry.get(offset_key), entry.get(length_key)
    for key, value in ((offset_key, offset), (length_key, length)):
        if type(value) is not int or value < 0:
            raise ValueError(f"{key} of column {entry.get('name')!r} is not a byte count: {value!r}")
    assert isinstance(offset, int) and isinstance(length, int)
    if offset + length > size:
        raise ValueError(
            f"column {entry.get('name')!r}: bytes {offset}..{offset + length} lie outside the "
            f"payload of {size} bytes"
        )
    return offset, length


def _decode_column(entry: Any, view: memoryview, rows: int, swap: bool) -> DecodedColumn:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise ValueError("a column without a name")
    name, kind, encoding = entry["name"], entry.get("type"), entry.get("encoding")
    # The type ends up in the CLI's SQL (CAST ... AS type): only the known ones pass.
    if kind not in ENCODING_OF_TYPE or encoding != ENCODING_OF_TYPE[kind]:
        raise ValueError(f"column {name!r} has type {kind!r} with encoding {encoding!r}")
    typecode = TYPECODE_OF_ENCODING[encoding]
    offset, length = _region(entry, "offset", "length", len(view))
    if length != rows * struct.calcsize(typecode):
        raise ValueError(f"column {name!r} has {length} bytes for {rows} rows")
    data = _typed(typecode, view, offset, length, swap)
    valid = None
    if "valid_offset" in entry:
        offset, length = _region(entry, "valid_offset", "valid_length", len(view))
        if length != rows:
            raise ValueError(f"column {name!r} has {length} validity bytes for {rows} rows")
        valid = _typed("b", view, offset, length, False)
    dictionary = None
    if encoding == "dict":
        count = entry.get("dict_count")
        if type(count) is not int or count < 0:
            raise ValueError(f"column {name!r} has a dict_count of {count!r}")
        entry = dict(entry, dict_length=4 * count)
        offset, _ = _region(entry, "dict_offset", "dict_length", len(view))
        lengths = _typed("I", view, offset, 4 * count, swap)
        start, length = _region(entry, "dict_bytes_offset", "dict_bytes_length", len(view))
        if sum(lengths) != length:
            raise ValueError(f"column {name!r}: the dictionary's lengths do not add up to its bytes")
        blob = bytes(view[start : start + length])
        dictionary, start = [], 0
        for size in lengths:
            dictionary.append(blob[start : start + size].decode("utf-8", "replace"))
            start += size
        if rows and not -1 <= min(data) <= max(data) < count:
            raise ValueError(f"column {name!r} has codes outside its dictionary of {count} words")
    return DecodedColumn(name, kind, encoding, data, valid, dictionary)


def decode_table(descriptor: Any, payload: ByteChunk) -> DecodedTable:
    """Inverse of `encode_table`; raises FrameError on a descriptor that does not fit.

    The CLI decodes what an agent sent, and the agent may be a hostile job: every offset and
    length is checked against the payload, every type against the known ones, and every
    dictionary code against its dictionary, so a malformed table is an error, never a wrong
    value read from elsewhere or an exception from deep inside.
    """
    try:
        if not isinstance(descriptor, dict):
            raise ValueError("the table descriptor is not an object")
        byteorder = descriptor.get("byteorder", sys.byteorder)
        if byteorder not in ("little", "big"):
            raise ValueError(f"byteorder {byteorder!r}")
        rows, name, notes = descriptor.get("rows"), descriptor.get("name"), descriptor.get("notes") or []
        if type(rows) is not int or rows < 0:
            raise ValueError(f"rows is {rows!r}")
        if not isinstance(name, str) or not isinstance(notes, list):
            raise ValueError("no table name, or notes that are not a list")
        entries = descriptor.get("columns")
        if not isinstance(entries, list):
            raise ValueError("columns is not a list")
        view = memoryview(payload).cast("B")
        columns = [_decode_column(entry, view, rows, byteorder != sys.byteorder) for entry in entries]
        return DecodedTable(name, rows, columns, [str(note) for note in notes])
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise FrameError(f"malformed table in reply: {error}", fatal=False) from None
