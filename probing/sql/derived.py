"""Tables the CLI makes of the rows of every rank, as DuckDB views over the tables it fetched:
python.collective_timings (schema/torch_tables.py documents its columns) over python.collectives.
A query that names one fetches its sources from each rank (`sources_named`); the view is made
once they are loaded (`make_views`)."""

from __future__ import annotations

from typing import Any, List

from ..schema.tables import COLLECTIVES, JOB_TABLES

# Window functions over each collective (process group, sequence number) of the ranks queried.
COLLECTIVE_TIMINGS_SQL = """
WITH arrivals AS (
    SELECT rank, node, pg_id, pg_desc, pg_ranks, seq, op, time_created AS arrival, time_completed, state
    FROM python.collectives
    WHERE NOT coalesce(is_p2p, false) AND time_created IS NOT NULL AND seq IS NOT NULL
), judged AS (
    SELECT *, min(arrival) OVER each AS first_arrival, max(arrival) OVER each AS last_arrival,
           count(*) OVER each AS arrived
    FROM arrivals
    WINDOW each AS (PARTITION BY pg_id, seq)
)
SELECT CAST(rank AS INTEGER) AS rank, CAST(node AS INTEGER) AS node, pg_id, pg_desc,
       CAST(seq AS BIGINT) AS seq, op, arrival,
       arrival - first_arrival AS late_s, last_arrival - arrival AS wait_s,
       arrival = last_arrival AS last, CAST(arrived AS BIGINT) AS ranks_arrived,
       CAST(json_array_length(TRY_CAST(pg_ranks AS JSON)) AS BIGINT) AS group_size,
       time_completed - arrival AS duration_s, state
FROM judged
"""

SOURCES = {"python.collective_timings": (COLLECTIVES.name,)}
DEFINITIONS = {"python.collective_timings": COLLECTIVE_TIMINGS_SQL}


def sources_named(names: List[str], referenced: Any) -> List[str]:
    """The tables to fetch for a query: `names` it names, with the sources of each view it names
    (`referenced(view names)` says which of them the query names)."""
    wanted = list(names)
    for view in referenced(list(JOB_TABLES)):
        wanted.extend(source for source in SOURCES[view] if source not in wanted)
    return wanted


def make_views(connection: Any, fetched: List[str]) -> None:
    """Make each view whose sources are all among the tables `fetched` into the session."""
    for view, sources in SOURCES.items():
        if all(source in fetched for source in sources):
            connection.execute(f"CREATE OR REPLACE VIEW {view} AS {DEFINITIONS[view]}")
