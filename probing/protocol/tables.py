"""Tables as typed columns in a frame's payload: shipping one costs the agent a few
`array.tobytes()` calls rather than a per-row serialisation under the target's GIL; the CLI
decodes what an agent sent, checking every offset against the payload.

Runs inside the target: standard library only, Python 3.8 syntax.
"""

from __future__ import annotations

import struct
import sys

from .frames import FrameError
from .texts import quoted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

    from .frames import ByteChunk

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
            raise ValueError(
                f"{key} of column {quoted(entry.get('name'))} is not a byte count: {quoted(value)}"
            )
    assert isinstance(offset, int) and isinstance(length, int)
    if offset + length > size:
        raise ValueError(
            f"column {quoted(entry.get('name'))}: bytes {offset}..{offset + length} lie outside the "
            f"payload of {size} bytes"
        )
    return offset, length


def _decode_column(entry: Any, view: memoryview, rows: int, swap: bool) -> DecodedColumn:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise ValueError("a column without a name")
    name, kind, encoding = entry["name"], entry.get("type"), entry.get("encoding")
    # The type ends up in the CLI's SQL (CAST ... AS type): only the known ones pass.
    if kind not in ENCODING_OF_TYPE or encoding != ENCODING_OF_TYPE[kind]:
        raise ValueError(f"column {quoted(name)} has type {quoted(kind)} with encoding {quoted(encoding)}")
    typecode = TYPECODE_OF_ENCODING[encoding]
    offset, length = _region(entry, "offset", "length", len(view))
    if length != rows * struct.calcsize(typecode):
        raise ValueError(f"column {quoted(name)} has {length} bytes for {rows} rows")
    data = _typed(typecode, view, offset, length, swap)
    valid = None
    if "valid_offset" in entry:
        offset, length = _region(entry, "valid_offset", "valid_length", len(view))
        if length != rows:
            raise ValueError(f"column {quoted(name)} has {length} validity bytes for {rows} rows")
        valid = _typed("b", view, offset, length, False)
    dictionary = None
    if encoding == "dict":
        count = entry.get("dict_count")
        if type(count) is not int or count < 0:
            raise ValueError(f"column {quoted(name)} has a dict_count of {quoted(count)}")
        entry = dict(entry, dict_length=4 * count)
        offset, _ = _region(entry, "dict_offset", "dict_length", len(view))
        lengths = _typed("I", view, offset, 4 * count, swap)
        start, length = _region(entry, "dict_bytes_offset", "dict_bytes_length", len(view))
        if sum(lengths) != length:
            raise ValueError(f"column {quoted(name)}: the dictionary's lengths do not add up to its bytes")
        blob = bytes(view[start : start + length])
        dictionary, start = [], 0
        for size in lengths:
            dictionary.append(blob[start : start + size].decode("utf-8", "replace"))
            start += size
        if rows and not -1 <= min(data) <= max(data) < count:
            raise ValueError(f"column {quoted(name)} has codes outside its dictionary of {count} words")
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
            raise ValueError(f"byteorder {quoted(byteorder)}")
        rows, name, notes = descriptor.get("rows"), descriptor.get("name"), descriptor.get("notes") or []
        if type(rows) is not int or rows < 0:
            raise ValueError(f"rows is {quoted(rows)}")
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
