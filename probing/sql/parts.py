"""The loads of one table (a rank's fetched table each, or rows this process read itself) made
into one set of columns: concatenated by name in numpy, dictionaries merged, each added column
(`rank`, `node`) filled from its load's constants, a column a load lacks NULL in its rows.
DuckDB then reads one registered table per name. A view over one registered part per load cost
1 024 ranks minutes (a 1 024-way UNION, each part with its own dictionaries), measured in
docs/scale.md.
"""

from __future__ import annotations

from ..protocol.tables import ENCODING_OF_TYPE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

    from ..protocol.tables import DecodedTable
    from ..schema.tables import Table

_DTYPES = {"i64": "int64", "f64": "float64", "bool": "int8", "dict": "int32"}


def encoding_of(kind: str) -> str:
    """How a column of type `kind` is held: the wire's encoding, and for the types only this
    side makes (the added INTEGER columns) the nearest one."""
    return ENCODING_OF_TYPE.get(kind) or ("i64" if kind in ("INTEGER", "SMALLINT", "TINYINT") else "dict")


class Piece:
    """One column of one load: its values as numpy data, its validity (None: all valid) and,
    dictionary-coded, its words (code -1 is NULL; BOOLEAN's -1 is NULL too)."""

    __slots__ = ("type", "data", "valid", "words")

    def __init__(
        self, type: str, data: Any, valid: Any = None, words: Optional[Sequence[str]] = None
    ) -> None:
        self.type = type
        self.data = data
        self.valid = valid
        self.words = words


class Part:
    """One load: its row count, its columns by name (lower case), and the added columns' values
    for its rows."""

    __slots__ = ("rows", "columns", "constants")

    def __init__(self, rows: int, columns: Dict[str, Piece], constants: Optional[Dict[str, Any]]) -> None:
        self.rows = rows
        self.columns = columns
        self.constants = constants


def part_of_table(table: DecodedTable, constants: Optional[Dict[str, Any]]) -> Part:
    """A fetched table's columns, as the wire gave them (no copy of the data)."""
    import numpy

    columns = {}
    for column in table.columns:
        data = numpy.frombuffer(column.data, dtype=_DTYPES[column.encoding])  # type: ignore[call-overload]
        valid = None if column.valid is None else numpy.frombuffer(column.valid, dtype=numpy.int8)  # type: ignore[call-overload]
        columns[column.name.lower()] = Piece(column.type, data, valid, column.dictionary)
    return Part(table.rows, columns, constants)


def part_of_rows(
    table: Table, rows: Sequence[Sequence[Any]], clean: Any, constants: Optional[Dict[str, Any]]
) -> Part:
    """Plain rows (tuples in the order of `table`'s columns), each value passed through
    `clean(type, value)` first: TIMESTAMP as seconds since the epoch, JSON as its text."""
    import numpy

    columns = {}
    for index, column in enumerate(table.columns):
        values = [clean(column.type, row[index]) for row in rows]
        encoding = encoding_of(column.type)
        if encoding == "dict":
            codes: Dict[str, int] = {}
            texts = [v if v is None or isinstance(v, str) else _text(column.type, v) for v in values]
            data = numpy.array(
                [-1 if v is None else codes.setdefault(v, len(codes)) for v in texts], numpy.int32
            )
            columns[column.name.lower()] = Piece(column.type, data, None, list(codes))
        elif encoding == "bool":
            data = numpy.array([-1 if v is None else int(bool(v)) for v in values], numpy.int8)
            columns[column.name.lower()] = Piece(column.type, data)
        else:
            valid = numpy.array([v is not None for v in values], numpy.int8)
            zero = 0.0 if encoding == "f64" else 0
            data = numpy.array([zero if v is None else v for v in values], _DTYPES[encoding])
            columns[column.name.lower()] = Piece(column.type, data, None if valid.all() else valid)
    return Part(len(rows), columns, constants)


def _text(kind: str, value: Any) -> str:
    """A plain value of a text column as the wire would carry it: JSON text for JSON and list
    columns (a list of file names, a dict of settings), the value's str() for VARCHAR."""
    if kind == "VARCHAR":
        return str(value)
    import json

    return json.dumps(value)


def _constant(kind: str, value: Any, rows: int) -> Piece:
    import numpy

    encoding = encoding_of(kind)
    if encoding == "dict":
        if value is None:
            return Piece(kind, numpy.full(rows, -1, numpy.int32), None, [])
        return Piece(kind, numpy.zeros(rows, numpy.int32), None, [str(value)])
    if encoding == "bool":
        return Piece(kind, numpy.full(rows, -1 if value is None else int(bool(value)), numpy.int8))
    data = numpy.full(rows, 0 if value is None else value, _DTYPES[encoding])
    return Piece(kind, data, None if value is not None else numpy.zeros(rows, numpy.int8))


def _missing(kind: str, rows: int) -> Piece:
    return _constant(kind, None, rows)


def merged_column(name: str, kind: str, added: bool, parts: List[Part], word: Any) -> Piece:
    """Column `name` of type `kind` over every part: a part's own column of that type, its
    constant when the column is an added one (which takes the place of the part's own), or NULL.
    `word(kind, text)` is what a dictionary word becomes (JSON text made readable to DuckDB)."""
    import numpy

    pieces = []
    for part in parts:
        if added and part.constants is not None:
            pieces.append(_constant(kind, part.constants.get(name), part.rows))
            continue
        piece = part.columns.get(name.lower())  # by name, as SQL reads names: any case
        pieces.append(piece if piece is not None and piece.type == kind else _missing(kind, part.rows))
    encoding = encoding_of(kind)
    valid = None
    if any(piece.valid is not None for piece in pieces):
        valid = numpy.concatenate(
            [
                piece.valid if piece.valid is not None else numpy.ones(len(piece.data), numpy.int8)
                for piece in pieces
            ]
        )
    if encoding != "dict":
        return Piece(kind, numpy.concatenate([piece.data for piece in pieces]), valid)
    index: Dict[str, int] = {}
    coded = []
    for piece in pieces:
        words = piece.words or []
        # Each part's codes moved to the merged dictionary; -1 (NULL) stays -1, and so does a
        # code no word has (the job's reply is untrusted).
        moved = numpy.array([index.setdefault(w, len(index)) for w in words] + [-1], numpy.int32)
        codes = numpy.where((piece.data >= 0) & (piece.data < len(words)), piece.data, -1)
        coded.append(moved[codes])
    return Piece(kind, numpy.concatenate(coded), valid, [word(kind, w) for w in index])


def merged(
    columns: Sequence[Tuple[str, str]], added: Sequence[str], parts: List[Part], word: Any
) -> Dict[str, Piece]:
    """Every column of the session's table (name, type), over every part."""
    return {name: merged_column(name, kind, name in added, parts, word) for name, kind in columns}
