"""The wire format: the one package both the CLI and the agent import.

frames (framing, reading within bounds, sending), messages (requests, replies, error kinds),
tables (typed columns in the payload), texts (long texts in the payload). Every name is
re-exported here, so `from probing import protocol; protocol.send_frame(...)` reads as before.

Runs inside the target: standard library only, Python 3.8 syntax.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .frames import MAGIC as MAGIC
    from .frames import MAX_HEADER_BYTES as MAX_HEADER_BYTES
    from .frames import MAX_REPLY_BYTES as MAX_REPLY_BYTES
    from .frames import MAX_REQUEST_BYTES as MAX_REQUEST_BYTES
    from .frames import PREFIX as PREFIX
    from .frames import ByteChunk as ByteChunk
    from .frames import ConnectionClosed as ConnectionClosed
    from .frames import Frame as Frame
    from .frames import FrameError as FrameError
    from .frames import FrameReader as FrameReader
    from .frames import FrameTimeout as FrameTimeout
    from .frames import encode_header as encode_header
    from .frames import frame_buffers as frame_buffers
    from .frames import json_dumps as json_dumps
    from .frames import json_loads as json_loads
    from .frames import recv_frame as recv_frame
    from .frames import send_buffers as send_buffers
    from .frames import send_frame as send_frame
    from .messages import PROTOCOL_VERSION as PROTOCOL_VERSION
    from .messages import ErrorKind as ErrorKind
    from .messages import error_reply as error_reply
    from .messages import ok_reply as ok_reply
    from .messages import parse_reply as parse_reply
    from .messages import parse_request as parse_request
    from .messages import request as request
    from .tables import ENCODING_OF_TYPE as ENCODING_OF_TYPE
    from .tables import TYPECODE_OF_ENCODING as TYPECODE_OF_ENCODING
    from .tables import ColumnBuffers as ColumnBuffers
    from .tables import DecodedColumn as DecodedColumn
    from .tables import DecodedTable as DecodedTable
    from .tables import decode_table as decode_table
    from .tables import encode_table as encode_table
    from .texts import decode_texts as decode_texts
    from .texts import encode_texts as encode_texts

# Which submodule holds each name. A name is imported on first use (PEP 562), so that importing
# one submodule (the agent's server takes only the error kinds when it starts) does not load
# them all: the agent defers the protocol to its first connection.
_HOME = {
    "ConnectionClosed": "frames",
    "Frame": "frames",
    "FrameError": "frames",
    "FrameReader": "frames",
    "FrameTimeout": "frames",
    "MAGIC": "frames",
    "MAX_HEADER_BYTES": "frames",
    "MAX_REPLY_BYTES": "frames",
    "MAX_REQUEST_BYTES": "frames",
    "PREFIX": "frames",
    "encode_header": "frames",
    "frame_buffers": "frames",
    "json_dumps": "frames",
    "json_loads": "frames",
    "recv_frame": "frames",
    "send_buffers": "frames",
    "send_frame": "frames",
    "ErrorKind": "messages",
    "PROTOCOL_VERSION": "messages",
    "error_reply": "messages",
    "ok_reply": "messages",
    "parse_reply": "messages",
    "parse_request": "messages",
    "request": "messages",
    "ColumnBuffers": "tables",
    "DecodedColumn": "tables",
    "DecodedTable": "tables",
    "ENCODING_OF_TYPE": "tables",
    "TYPECODE_OF_ENCODING": "tables",
    "decode_table": "tables",
    "encode_table": "tables",
    "decode_texts": "texts",
    "encode_texts": "texts",
}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    __import__(f"{__name__}.{home}")
    value = getattr(sys.modules[f"{__name__}.{home}"], name)
    globals()[name] = value
    return value


__all__ = [
    "ENCODING_OF_TYPE", "MAGIC", "MAX_HEADER_BYTES", "MAX_REPLY_BYTES", "MAX_REQUEST_BYTES",
    "PREFIX", "PROTOCOL_VERSION", "TYPECODE_OF_ENCODING", "ColumnBuffers", "ConnectionClosed",
    "DecodedColumn", "DecodedTable", "ErrorKind", "Frame", "FrameError", "FrameReader",
    "FrameTimeout", "decode_table", "decode_texts", "encode_header", "encode_table",
    "encode_texts", "error_reply", "frame_buffers", "json_dumps", "json_loads", "ok_reply",
    "parse_reply", "parse_request", "recv_frame", "request", "send_buffers", "send_frame",
]  # fmt: skip
