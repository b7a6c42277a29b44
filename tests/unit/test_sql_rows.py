"""Rows this process builds itself (stacks read from outside, core files, records) loaded into
DuckDB by whole columns (sql/parts.py part_of_rows): the same table as value by value, whatever
the values, in a fraction of its time."""

from __future__ import annotations

import math
import time
from typing import Any, List, Sequence, Tuple

import pytest

from probing.schema.definition import Column, Table
from probing.schema.tables import BACKTRACE
from probing.sql.parts import Part, _column_of_values
from probing.sql.session import SqlSession, _plain

MIXED = Table(
    "python.mixed",
    "every kind of column a table built here has",
    [
        Column("number", "BIGINT", ""),
        Column("ratio", "DOUBLE", ""),
        Column("flag", "BOOLEAN", ""),
        Column("text", "VARCHAR", ""),
        Column("settings", "JSON", ""),
        Column("names", "VARCHAR[]", ""),
        Column("at", "TIMESTAMP", ""),
    ],
)

# Columns whose values take each way: plain, with None, NaN beside None, bools among ints, text
# with a lone surrogate (a file name py-spy decoded with surrogateescape) and its own escape,
# JSON given as text and as a dict, a time out of range.
ROWS: List[Tuple[Any, ...]] = [
    (1, 0.5, True, "a", '{"k": 1}', ["x"], 1.7e9),
    (None, None, None, None, None, None, None),
    (2**40, math.nan, False, "caf\udce9", {"k": [1, 2]}, None, 1e300),
    (True, 2, 2, "caf\\udce9", '{"k": 1}', ["x", "y"], -1.0),
    (3, 1.0, True, "", "null", [], math.nan),
]


def by_value(table: Table, rows: Sequence[Sequence[Any]]) -> List[Tuple[Any, ...]]:
    """What the table held when every value was cleaned and coded one by one."""
    session = SqlSession([table.describe()])
    pieces = {
        column.name.lower(): _column_of_values(column.type, [_plain(column.type, row[i]) for row in rows])
        for i, column in enumerate(table.columns)
    }
    session._add_part(table.name, Part(len(rows), pieces, None))
    return [tuple(row) for row in session.run(f"SELECT * FROM {table.name}").rows]


def loaded(table: Table, rows: Sequence[Sequence[Any]]) -> List[Tuple[Any, ...]]:
    session = SqlSession([table.describe()])
    session.load_rows(table, rows)
    return [tuple(row) for row in session.run(f"SELECT * FROM {table.name}").rows]


def same(left: List[Tuple[Any, ...]], right: List[Tuple[Any, ...]]) -> bool:
    nan = object()  # NaN equals nothing, not even itself
    clean = [[nan if isinstance(v, float) and math.isnan(v) else v for v in row] for row in left + right]
    return clean[: len(left)] == clean[len(left) :]


@pytest.mark.parametrize("rows", [ROWS, ROWS[:1], ROWS[1:2], [row for row in ROWS if row[0] is not True]])
def test_whole_columns_load_what_values_one_by_one_loaded(rows: List[Tuple[Any, ...]]) -> None:
    assert same(loaded(MIXED, rows), by_value(MIXED, rows))


def test_none_text_and_nan_stay_apart() -> None:
    rows = [(1, math.nan, True, None, None, None, None), (2, None, False, "b", None, None, None)]
    got = loaded(MIXED, rows)
    assert math.isnan(got[0][1]) and got[1][1] is None
    assert got[0][3] is None and got[1][3] == "b"


def stacks(count: int) -> List[Tuple[Any, ...]]:
    """python.backtrace rows as a read from outside of a big job gives them."""
    return [(4242, 140000 + i % 64, 5000 + i % 64, f"thread-{i % 64}", i % 64 == 0, i % 40,
             f"func{i % 500}", f"/job/src/file{i % 80}.py", i % 900, "Python", None, "py-spy")
            for i in range(count)]  # fmt: skip


@pytest.mark.serial
def test_a_hundred_thousand_stacks_load_in_a_fraction_of_the_value_by_value_time() -> None:
    """Measured against the value-by-value build of the same rows in the same process (best of
    three each): ~0.25x here; before, load_rows was that build (1x)."""
    rows = stacks(100_000)

    def best(work: Any) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            work()
            times.append(time.perf_counter() - started)
        return min(times)

    session = SqlSession([BACKTRACE.describe()])
    whole = best(lambda: session.load_rows(BACKTRACE, rows))
    one_by_one = best(
        lambda: [
            _column_of_values(column.type, [_plain(column.type, row[i]) for row in rows])
            for i, column in enumerate(BACKTRACE.columns)
        ]
    )
    assert whole < 0.6 * one_by_one, (whole, one_by_one)
