"""The loads of one table (a rank's fetched table each, or rows this process read itself) made
into one set of columns: concatenated by name in numpy, dictionaries merged, each added column
(`rank`, `node`) filled from its load's constants, a column a load lacks NULL in its rows.
DuckDB then reads one registered table per name. A view over one registered part per load cost
1 024 ranks minutes (a 1 024-way UNION, each part with its own dictionaries), measured in
docs/scale.md.
"""

from __future__ import annotations

from functools import partial

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
    `clean(type, value)` first: TIMESTAMP as seconds since the epoch, JSON as its text.

    A column goes to numpy in one pass over the rows where its values allow it (numbers,
    booleans, text, with or without None), each step done in C: a text column is coded as it is
    read, and only its distinct words are cleaned. Value by value, 100 000 stacks read from
    outside took ~360 ms; so, ~100 ms (benchmarks/bench_outside.py). Any other column (TIMESTAMP,
    JSON not yet text, a mix of types) is made value by value, with the same result."""
    columns = {}
    for index, column in enumerate(table.columns):
        piece = _whole_column(column.type, rows, index, clean)
        if piece is None:
            piece = _column_of_values(column.type, [clean(column.type, row[index]) for row in rows])
        columns[column.name.lower()] = piece
    return Part(len(rows), columns, constants)


_NONE = type(None)


def _whole_column(kind: str, rows: Sequence[Sequence[Any]], index: int, clean: Any) -> Optional[Piece]:
    """Column `index` of `rows` made in numpy by passes in C, or None where its values need a
    look each. numpy.fromiter converts as numpy.array does, and refuses what it cannot (None in
    a number column, a number too large): those columns go value by value, as before."""
    from operator import itemgetter

    import numpy

    encoding, count = encoding_of(kind), len(rows)
    values = partial(map, itemgetter(index), rows)
    try:
        if encoding == "dict":
            return _text_column(kind, values, count, clean)
        if encoding == "bool":
            if not set(map(type, dict.fromkeys(values()))) <= {bool}:
                return None  # an int among them: int(bool(2)) is 1, numpy's int8 2
            return Piece(kind, numpy.fromiter(values(), numpy.int8, count))
        if kind == "TIMESTAMP":
            return None  # out of range is NULL (clean)
        data = numpy.fromiter(values(), _DTYPES[encoding], count)
    except (TypeError, ValueError, OverflowError):
        return None
    if encoding == "f64" and numpy.isnan(data).any():
        return None  # numpy reads None as NaN: which is which is told value by value
    return Piece(kind, data)


def _text_column(kind: str, values: Any, count: int, clean: Any) -> Optional[Piece]:
    """A dictionary-coded column, coded as it is read: each new word gets the next code (a
    defaultdict whose default is its own length), so one pass in C gives codes and words."""
    from collections import defaultdict

    import numpy

    code_of: Dict[Any, int] = defaultdict()
    code_of.default_factory = code_of.__len__  # type: ignore[attr-defined]
    data = numpy.fromiter(map(code_of.__getitem__, values()), numpy.int32, count)
    words = list(code_of)
    if not set(map(type, words)) <= {str, _NONE}:
        return None  # a list or a dict of a JSON column: made text value by value (_text)
    if None in code_of:
        null = code_of[None]
        data = numpy.where(data == null, -1, data - (data > null)).astype(numpy.int32)
        words.remove(None)
    # Cleaning (a lone surrogate made its escape) may make two words one: codes still point at
    # the right text, and merging dictionaries keys on the words (merged_column).
    return Piece(kind, data, None, [clean(kind, word) for word in words])


def _column_of_values(kind: str, values: List[Any]) -> Piece:
    """A column made value by value (values already cleaned)."""
    import numpy

    encoding = encoding_of(kind)
    if encoding == "dict":
        codes: Dict[str, int] = {}
        texts = [v if v is None or isinstance(v, str) else _text(kind, v) for v in values]
        data = numpy.array([-1 if v is None else codes.setdefault(v, len(codes)) for v in texts], numpy.int32)
        return Piece(kind, data, None, list(codes))
    if encoding == "bool":
        return Piece(kind, numpy.array([-1 if v is None else int(bool(v)) for v in values], numpy.int8))
    valid = numpy.array([v is not None for v in values], numpy.int8)
    zero = 0.0 if encoding == "f64" else 0
    data = numpy.array([zero if v is None else v for v in values], _DTYPES[encoding])
    return Piece(kind, data, None if valid.all() else valid)


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
