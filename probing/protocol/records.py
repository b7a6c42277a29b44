"""The record file: what a job left behind, in the protocol's own frames.

    RECORD_MAGIC (8 bytes)
    frame  {"record": RECORD_VERSION, ...about the process and why it was written}
    frame  {"table": descriptor}  + the table's columns as payload     (one per table)
    frame  {"end": number of table frames}

The agent writes a record (`write_record`) into a temporary file beside its final name and
renames it into place, so a reader never sees half of one; the last frame says how many
tables came before it, so a record cut short by a full disk or a kill is told apart from a
whole one. The CLI reads one (`read_record`) as untrusted input: the job that wrote it may be
hostile, so every length is bounded and every table is decoded by `decode_table`'s checks.

Runs inside the target: standard library only, Python 3.8 syntax.
"""

from __future__ import annotations

import os

from .frames import MAGIC, MAX_HEADER_BYTES, PREFIX, frame_buffers, json_loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Dict, List, Sequence, Tuple

    from .frames import ByteChunk

RECORD_MAGIC = b"PRBREC\x00\x01"
RECORD_VERSION = 1
SUFFIX = ".probing"
# Records an agent removed to keep its directory within its bounds, one JSON object a line (name,
# job, bytes, written_at, pruned_at, by_pid, why), rotated to the older name once large:
# `probing records` says from them what went and why (agent/records/retention.py writes them).
PRUNED_LOG = ".pruned.jsonl"
PRUNED_LOG_OLDER = ".pruned.1.jsonl"
# A record bigger than this is not read by default: the agent caps its records at 256 MB
# (PROBING_RECORD_MAX_MB), and reading one builds a Python row per table row.
MAX_RECORD_BYTES = 1 << 30


class RecordFormatError(Exception):
    """A file that is not a whole record this probing can read; the message says which."""


def write_record(
    directory: str,
    name: str,
    header: Dict[str, Any],
    tables: Sequence[Tuple[Dict[str, Any], Sequence[ByteChunk]]],
) -> str:
    """Write `header` and `tables` ((descriptor, payload chunks) as `encode_table` returns
    them) as `directory/name`, atomically; returns the path. Raises OSError."""
    path = os.path.join(directory, name)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(RECORD_MAGIC)
            _write_frame(out, dict(header, record=RECORD_VERSION), ())
            for descriptor, chunks in tables:
                _write_frame(out, {"table": descriptor}, chunks)
            _write_frame(out, {"end": len(tables)}, ())
            out.flush()
            os.fsync(out.fileno())
        os.rename(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return path


def _write_frame(out: BinaryIO, header: Dict[str, Any], chunks: Sequence[ByteChunk]) -> None:
    for buffer in frame_buffers(header, chunks):
        out.write(buffer)


class RecordFile:
    """A record as read: its header, and each table's descriptor with its payload."""

    __slots__ = ("path", "header", "tables")

    def __init__(self, path: str, header: Dict[str, Any], tables: List[Tuple[Dict[str, Any], bytes]]) -> None:
        self.path = path
        self.header = header
        self.tables = tables


def read_record(path: str, max_bytes: int = MAX_RECORD_BYTES) -> RecordFile:
    """The record at `path`; RecordFormatError for anything that is not a whole record of
    this format's version, OSError when the file cannot be read."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > max_bytes:
            raise RecordFormatError(f"{size} bytes, more than the {max_bytes} a record may hold")
        header = read_header(handle, size)
        tables: List[Tuple[Dict[str, Any], bytes]] = []
        while True:
            frame, payload = _read_frame(handle, size)
            if "end" in frame:
                if not _is_int(frame["end"]) or frame["end"] != len(tables):
                    raise RecordFormatError(f"it says {frame['end']!r} tables but holds {len(tables)}")
                break
            descriptor = frame.get("table")
            if not isinstance(descriptor, dict):
                raise RecordFormatError("a frame that is neither a table nor the end")
            tables.append((descriptor, payload))
        if handle.read(1):
            raise RecordFormatError("bytes after the end of the record")
    return RecordFile(path, header, tables)


def read_header(handle: BinaryIO, size: int) -> Dict[str, Any]:
    """The header of the record `handle` reads from its start (`size`: the file's size),
    reading no further than its first frame; RecordFormatError as `read_record` says."""
    magic = handle.read(len(RECORD_MAGIC))
    if magic != RECORD_MAGIC:
        if magic[:6] == RECORD_MAGIC[:6]:
            raise RecordFormatError("a record of another format version than this probing reads")
        raise RecordFormatError("not a probing record")
    header, _ = _read_frame(handle, size, with_payload=False)
    version = header.get("record")
    if not _is_int(version) or version != RECORD_VERSION:
        raise RecordFormatError(
            f"a record of format version {version!r}; this probing reads version {RECORD_VERSION}"
        )
    return header


def _is_int(value: Any) -> bool:
    # True == 1: a header saying {"record": true} is not a version-1 record.
    return isinstance(value, int) and not isinstance(value, bool)


_CUT_SHORT = "cut short: the file ends before the record does (the job died writing it?)"


def _read_frame(handle: BinaryIO, size: int, with_payload: bool = True) -> Tuple[Dict[str, Any], bytes]:
    prefix = handle.read(PREFIX.size)
    if len(prefix) < PREFIX.size:
        raise RecordFormatError(_CUT_SHORT)
    magic, header_length, payload_length = PREFIX.unpack(prefix)
    if magic != MAGIC or header_length > MAX_HEADER_BYTES:
        raise RecordFormatError("a damaged frame")
    # Lengths that pass the end of the file: what a kill during the write leaves (the agent
    # writes into a temporary name, but a copied or salvaged file may still end early).
    if header_length + payload_length > size - handle.tell():
        raise RecordFormatError(_CUT_SHORT)
    header_bytes = handle.read(header_length)
    payload = handle.read(payload_length) if with_payload else b""
    if len(header_bytes) < header_length or len(payload) < (payload_length if with_payload else 0):
        raise RecordFormatError(_CUT_SHORT)
    try:
        header = json_loads(header_bytes.decode("utf-8"))
    except ValueError:
        raise RecordFormatError("a frame whose header is not JSON") from None
    if not isinstance(header, dict):
        raise RecordFormatError("a frame whose header is not an object")
    return header, payload
