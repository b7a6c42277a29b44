"""The wire format: the one package both the CLI and the agent import.

frames (framing, reading within bounds, sending), messages (requests, replies, error kinds),
tables (typed columns in the payload), texts (long texts in the payload). Every name is
re-exported here, so `from probing import protocol; protocol.send_frame(...)` reads as before.

Runs inside the target: standard library only, Python 3.8 syntax.
"""

from __future__ import annotations

from .frames import (
    MAGIC,
    MAX_HEADER_BYTES,
    MAX_REPLY_BYTES,
    MAX_REQUEST_BYTES,
    PREFIX,
    ConnectionClosed,
    Frame,
    FrameError,
    FrameReader,
    FrameTimeout,
    encode_header,
    frame_buffers,
    json_dumps,
    json_loads,
    recv_frame,
    send_buffers,
    send_frame,
)
from .messages import (
    PROTOCOL_VERSION,
    ErrorKind,
    error_reply,
    ok_reply,
    parse_reply,
    parse_request,
    request,
)
from .tables import (
    ENCODING_OF_TYPE,
    TYPECODE_OF_ENCODING,
    ColumnBuffers,
    DecodedColumn,
    DecodedTable,
    decode_table,
    encode_table,
)
from .texts import decode_texts, encode_texts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .frames import ByteChunk as ByteChunk

__all__ = [
    "ENCODING_OF_TYPE", "MAGIC", "MAX_HEADER_BYTES", "MAX_REPLY_BYTES", "MAX_REQUEST_BYTES",
    "PREFIX", "PROTOCOL_VERSION", "TYPECODE_OF_ENCODING", "ColumnBuffers", "ConnectionClosed",
    "DecodedColumn", "DecodedTable", "ErrorKind", "Frame", "FrameError", "FrameReader",
    "FrameTimeout", "decode_table", "decode_texts", "encode_header", "encode_table",
    "encode_texts", "error_reply", "frame_buffers", "json_dumps", "json_loads", "ok_reply",
    "parse_reply", "parse_request", "recv_frame", "request", "send_buffers", "send_frame",
]  # fmt: skip
