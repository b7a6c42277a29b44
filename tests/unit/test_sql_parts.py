"""Many loads of one table made into one (sql/parts.py): the rows of every rank, by column name,
with each rank's constants, dictionaries merged, what a load lacks or cannot hold NULL; and a
thousand ranks' loads queried in about the time of one (a view re-made per load took minutes)."""

from __future__ import annotations

import math
import time
from typing import Any, Dict, List, Sequence, Tuple

from probing.agent.columns import TableBuilder
from probing.protocol.tables import DecodedTable, decode_table
from probing.schema.tables import AGENT_TABLES, BACKTRACE, RANK_COLUMNS
from probing.sql.session import SqlSession


def table(name: str, columns: Sequence[Tuple[str, str]], rows: List[List[Any]]) -> DecodedTable:
    builder = TableBuilder(name, list(columns))
    for row in rows:
        builder.append(row)
    descriptor, chunks = builder.encode()
    return decode_table(descriptor, bytearray(b"".join(bytes(chunk) for chunk in chunks)))


def ranks_session() -> SqlSession:
    return SqlSession([described.describe() for described in AGENT_TABLES.values()], RANK_COLUMNS)


def rows_of(session: SqlSession, sql: str) -> List[Tuple[Any, ...]]:
    return [tuple(row) for row in session.run(sql).rows]


def test_each_ranks_rows_keep_their_rank_words_and_nulls() -> None:
    session = ranks_session()
    # Two ranks whose agents differ by a version: the older sends no `source` column.
    newer = [
        ("pid", "BIGINT"),
        ("thread_id", "BIGINT"),
        ("func", "VARCHAR"),
        ("lineno", "BIGINT"),
        ("source", "VARCHAR"),
    ]
    older = [("pid", "BIGINT"), ("func", "VARCHAR"), ("lineno", "BIGINT"), ("thread_id", "BIGINT")]
    first = [[10, 1, "all_reduce", 7, "agent"], [10, 2, None, None, "agent"]]
    session.load(table(BACKTRACE.name, newer, first), {"rank": 0, "local_rank": 0, "node": 0})
    session.load(
        table(BACKTRACE.name, older, [[20, "load_shard", 42, 1]]), {"rank": 1, "local_rank": 1, "node": 3}
    )
    got = rows_of(
        session,
        "SELECT rank, node, pid, thread_id, func, lineno, source FROM python.backtrace "
        "ORDER BY rank, thread_id",
    )
    assert got == [(0, 0, 10, 1, "all_reduce", 7, "agent"), (0, 0, 10, 2, None, None, "agent"),
                   (1, 3, 20, 1, "load_shard", 42, None)]  # fmt: skip


def test_a_code_no_word_has_is_null_not_a_crash() -> None:
    """A hostile agent's dictionary codes past its words."""
    bad = table(BACKTRACE.name, [("func", "VARCHAR")], [["a"], ["b"]])
    bad.columns[0].data = memoryview(bytearray((7).to_bytes(4, "little") + (1).to_bytes(4, "little"))).cast(
        "i"
    )
    session = ranks_session()
    session.load(bad, {"rank": 5})
    assert rows_of(session, "SELECT rank, func FROM python.backtrace") == [(5, None), (5, "b")]


def test_nan_stays_nan_and_plain_rows_join_the_fetched_ones() -> None:
    session = SqlSession([described.describe() for described in AGENT_TABLES.values()])
    session.load(table(BACKTRACE.name, [("func", "VARCHAR"), ("lineno", "BIGINT")], [["fetched", 1]]))
    session.load_rows(
        BACKTRACE, [[1, 2, 3, "Main", True, 0, "outside", "/x.py", 9, "Python", {"k": [1]}, "py-spy"]]
    )
    got = rows_of(
        session, "SELECT func, lineno, CAST(locals AS VARCHAR), is_main FROM python.backtrace ORDER BY func"
    )
    assert got == [("fetched", 1, None, None), ("outside", 9, '{"k": [1]}', True)]
    modules = next(described for described in AGENT_TABLES.values() if described.name == "python.modules")
    doubles = [column.name for column in modules.columns if column.type == "DOUBLE"]
    session.load(table(modules.name, [(doubles[0], "DOUBLE")], [[math.nan], [1.5], [None]]))
    values = [row[0] for row in rows_of(session, f"SELECT {doubles[0]} FROM python.modules")]
    assert math.isnan(values[0]) and values[1:] == [1.5, None]


def test_a_thousand_ranks_are_queried_in_about_one_ranks_time() -> None:
    columns = [(column.name, column.type) for column in BACKTRACE.columns]
    one = table(BACKTRACE.name, columns, [
        [1000, thread, 2000 + thread, f"thread{thread}", thread == 0, depth, f"func{depth}",
         f"/x/file{depth}.py", 10 + depth, "Python", None, "agent"]
        for thread in range(4) for depth in range(8)
    ])  # fmt: skip
    times: Dict[int, float] = {}
    for ranks in (16, 1024):
        started = time.perf_counter()
        session = ranks_session()
        for rank in range(ranks):
            session.load(one, {"rank": rank, "local_rank": rank % 64, "node": rank // 64})
        counted = rows_of(session, "SELECT count(*), count(DISTINCT rank), max(node) FROM python.backtrace")
        times[ranks] = time.perf_counter() - started
        assert counted == [(32 * ranks, ranks, (ranks - 1) // 64)]
    # Linear in ranks at worst, with a floor for the session itself; the view re-made per load
    # was quadratic (256 ranks: 113 s on this machine).
    assert times[1024] < max(10 * times[16], 2.0) + 64 * times[16], times
