"""A bounded, columnar ring buffer for tables that record as the job runs (python.torch_trace).

Rows go into blocks of typed arrays, one array per column. A full block is frozen: nothing
writes to it again, so shipping the table sends the frozen blocks' memory as it is, without
copying or joining it, and only the block being filled is copied. When the ring is full its
oldest block (a sixteenth of the capacity) is dropped whole, so it holds between 15/16 of
`capacity` and `capacity` rows. Strings are stored as codes into one dictionary per ring
(`code()`), which only grows: module and stage names repeat millions of times and are few.

Writers append from the job's threads, the agent reads from its own: a lock guards the
block list and the block being filled, and is held only to append one row or to copy the
part of one block that is still being written.
"""

from __future__ import annotations

import array
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from ..originals import allocate_lock
from ..protocol.tables import ENCODING_OF_TYPE, TYPECODE_OF_ENCODING, ColumnBuffers, encode_table

if TYPE_CHECKING:
    from ..protocol.frames import ByteChunk


class _Block:
    __slots__ = ("columns", "valid", "rows")

    def __init__(self, typecodes: Sequence[str]) -> None:
        self.columns: List[array.array[Any]] = [array.array(code) for code in typecodes]
        # Per nullable column: None until the first NULL, then an int8 array (1 = value).
        self.valid: List[Optional[array.array[int]]] = [None] * len(typecodes)
        self.rows = 0


class Ring:
    BLOCKS = 16

    def __init__(self, name: str, columns: Sequence[Tuple[str, str]], capacity: int):
        self.name = name
        self.names = [column_name for column_name, _ in columns]
        self.types = [column_type for _, column_type in columns]
        self.typecodes = [TYPECODE_OF_ENCODING[ENCODING_OF_TYPE[t]] for t in self.types]
        capacity = max(1, capacity)
        self.block_rows = -(-capacity // self.BLOCKS)
        self.max_blocks = -(-capacity // self.block_rows)
        self.capacity = self.max_blocks * self.block_rows
        self.lock = allocate_lock()
        self.words: List[str] = []
        self._codes: Dict[str, int] = {}
        self.frozen: List[_Block] = []
        self.current = _Block(self.typecodes)
        self.dropped = 0  # rows pushed out of the ring since it was created

    def code(self, text: Optional[str]) -> int:
        """The dictionary code of a string column value (-1 for NULL)."""
        if text is None:
            return -1
        with self.lock:
            found = self._codes.get(text)
            if found is None:
                found = self._codes[text] = len(self.words)
                self.words.append(text)
            return found

    def append(self, row: Sequence[Any]) -> None:
        """One row, values in column order; string columns take codes from `code()`."""
        with self.lock:
            block = self.current
            index = 0
            for column, value in zip(block.columns, row):
                if value is None:
                    self._append_null(block, index)
                else:
                    column.append(value)
                    valid = block.valid[index]
                    if valid is not None:
                        valid.append(1)
                index += 1
            block.rows += 1
            if block.rows >= self.block_rows:
                self._freeze()

    @staticmethod
    def _append_null(block: _Block, index: int) -> None:
        valid = block.valid[index]
        if valid is None:
            valid = block.valid[index] = array.array("b", bytes([1]) * block.rows)
        valid.append(0)
        # Booleans and codes carry NULL in the value itself (-1), numbers in `valid`.
        block.columns[index].append(-1 if block.columns[index].typecode in "bi" else 0)

    def _freeze(self) -> None:
        self.frozen.append(self.current)
        self.current = _Block(self.typecodes)
        while len(self.frozen) >= self.max_blocks:
            self.dropped += self.frozen.pop(0).rows

    def __len__(self) -> int:
        with self.lock:
            return sum(block.rows for block in self.frozen) + self.current.rows

    def clear(self) -> None:
        with self.lock:
            self.frozen = []
            self.current = _Block(self.typecodes)

    def encode(self) -> Tuple[Dict[str, Any], List[ByteChunk]]:
        """The rows held now, as a table for the wire: frozen blocks by reference."""
        with self.lock:
            blocks = list(self.frozen)
            current = self.current
            partial_rows = current.rows
            partial = [column[:partial_rows] for column in current.columns]
            partial_valid = [None if v is None else v[:partial_rows] for v in current.valid]
            words = list(self.words)
        pieces = [(block.columns, block.valid, block.rows) for block in blocks]
        if partial_rows:
            pieces.append((partial, partial_valid, partial_rows))
        buffers = []
        for index, (name, column_type) in enumerate(zip(self.names, self.types)):
            data: List[ByteChunk] = [memoryview(columns[index]).cast("B") for columns, _, _ in pieces]
            valid: Optional[List[ByteChunk]] = None
            if ENCODING_OF_TYPE[column_type] in ("i64", "f64") and any(
                v[index] is not None for _, v, _ in pieces
            ):
                valid = []
                for _, validity, rows in pieces:
                    known = validity[index]
                    valid.append(memoryview(known).cast("B") if known is not None else bytes([1]) * rows)
            dictionary = words if ENCODING_OF_TYPE[column_type] == "dict" else None
            buffers.append(ColumnBuffers(name, column_type, data, valid, dictionary))
        return encode_table(self.name, sum(rows for _, _, rows in pieces), buffers)
