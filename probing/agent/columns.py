"""Typed column builders: tables are built as arrays and dictionary-coded strings.

Shipping a table is then a handful of `array.tobytes()` calls; the target's GIL is never
held for a per-row serialisation (DESIGN.md, "Agent rules").
"""

from __future__ import annotations

import array
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from ..originals import json_dumps
from ..protocol.tables import ENCODING_OF_TYPE, ColumnBuffers, encode_table

if TYPE_CHECKING:
    from ..protocol.frames import ByteChunk


class _Numeric:
    def __init__(self, typecode: str) -> None:
        self.values: array.array[Any] = array.array(typecode)
        self.valid: Optional[array.array[int]] = None

    def append(self, value: Any) -> None:
        if value is None:
            if self.valid is None:
                self.valid = array.array("b", bytes([1]) * len(self.values))
            self.values.append(0)
            self.valid.append(0)
            return
        self.values.append(value)
        if self.valid is not None:
            self.valid.append(1)

    def buffers(self) -> Tuple[ByteChunk, Optional[ByteChunk], Optional[List[str]]]:
        valid = self.valid.tobytes() if self.valid is not None else None
        return self.values.tobytes(), valid, None


class _Bool:
    def __init__(self) -> None:
        self.values: array.array[int] = array.array("b")

    def append(self, value: Any) -> None:
        self.values.append(-1 if value is None else 1 if value else 0)

    def buffers(self) -> Tuple[ByteChunk, Optional[ByteChunk], Optional[List[str]]]:
        return self.values.tobytes(), None, None


class _Strings:
    """Dictionary-coded strings: repeated file and function names are stored once."""

    def __init__(self, to_text: Any = None) -> None:
        self.codes: array.array[int] = array.array("i")
        self.index: Dict[str, int] = {}
        self.words: List[str] = []
        self.to_text = to_text

    def append(self, value: Any) -> None:
        if value is None:
            self.codes.append(-1)
            return
        text = self.to_text(value) if self.to_text is not None else value
        code = self.index.get(text)
        if code is None:
            code = self.index[text] = len(self.words)
            self.words.append(text)
        self.codes.append(code)

    def buffers(self) -> Tuple[ByteChunk, Optional[ByteChunk], Optional[List[str]]]:
        return self.codes.tobytes(), None, self.words


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json_dumps(value)


def new_column(column_type: str) -> Any:
    encoding = ENCODING_OF_TYPE[column_type]
    if encoding == "i64":
        return _Numeric("q")
    if encoding == "f64":
        return _Numeric("d")
    if encoding == "bool":
        return _Bool()
    if column_type == "VARCHAR":
        return _Strings()
    return _Strings(_json_text)


class TableBuilder:
    """Rows in, typed column buffers out."""

    def __init__(self, name: str, columns: Sequence[Tuple[str, str]]) -> None:
        self.name = name
        self.names = [column_name for column_name, _ in columns]
        self.types = [column_type for _, column_type in columns]
        self.columns = [new_column(column_type) for column_type in self.types]
        self.rows = 0
        self.notes: List[str] = []  # said on the CLI's stderr, e.g. "scan cut short"

    def append(self, row: Sequence[Any]) -> None:
        for column, value in zip(self.columns, row):
            column.append(value)
        self.rows += 1

    def encode(self) -> Tuple[Dict[str, Any], List[ByteChunk]]:
        buffers = []
        for name, column_type, column in zip(self.names, self.types, self.columns):
            data, valid, dictionary = column.buffers()
            buffers.append(ColumnBuffers(name, column_type, data, valid, dictionary))
        descriptor, chunks = encode_table(self.name, self.rows, buffers)
        if self.notes:
            descriptor["notes"] = list(self.notes)
        return descriptor, chunks
