"""Tracing sessions in python.torch_trace: which rows are of whole steps.

A step is a step only while tracing was on through all of it. Each `trace on` after a `trace off`
begins a session (the `session` column); the step under way when a session began is only part of
a step (its rows carry the session negated), and the step under way when it ended (`trace off`,
or now) is cut too. Between two sessions the job ran untraced for as long as tracing was off: a
step time taken across that gap is the gap, not a step. So step times are paced within a session,
and a session's first and last steps are left out.

A table from an agent older than the column (a record, another version's agent) is one session
whose first step is taken as whole.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

from ..errors import BadSQL
from ..sql.session import SqlSession

TABLE = "python.torch_trace"


def session_expression(session: SqlSession) -> str:
    """The SQL that gives a row's session: the column where the table has one, else 1."""
    try:
        columns = session.run(f"SELECT * FROM {TABLE} LIMIT 0").columns
    except BadSQL:
        return "1"
    return "session" if "session" in columns else "1"


def whole_steps_sql(session: SqlSession, by: str = "") -> str:
    """CTEs (to follow WITH): `traced`, the rows of python.torch_trace outside a session's first
    (partial) step, with `trace_session`; `bounded`, the same with `session_newest` (the session's
    newest step: under way, or cut by `trace off`) and `steps` (how many steps `traced` holds in
    all); and `whole`, the rows of whole steps: each session's newest step left out, but for a
    table that holds one step in all (its calls are all there is). `by`: a column whose values are
    different processes (rank), each counted apart."""
    expression = session_expression(session)
    key = f"{by}, " if by else ""
    counts = f"JOIN step_counts USING ({by})" if by else ", step_counts"
    return f"""
traced AS (
  SELECT *, {expression} AS trace_session FROM {TABLE} WHERE step IS NOT NULL AND {expression} > 0
), step_keys AS (
  SELECT DISTINCT {key}trace_session, step FROM traced
), session_ends AS (
  SELECT {key}trace_session, max(step) AS session_newest FROM step_keys GROUP BY ALL
), step_counts AS (
  SELECT {key}count(*) AS steps FROM step_keys GROUP BY ALL
), bounded AS (
  SELECT traced.*, session_newest, steps
  FROM traced JOIN session_ends USING ({key}trace_session) {counts}
), whole AS (
  SELECT * EXCLUDE (session_newest, steps) FROM bounded WHERE step < session_newest OR steps = 1
)"""


class Session(NamedTuple):
    number: int
    first: int
    last: int
    steps: int  # distinct steps with rows


def sessions(session: SqlSession) -> List[Session]:
    """The sessions of the table with rows of whole-or-cut steps, oldest first."""
    expression = session_expression(session)
    result = session.run(
        f"SELECT {expression} AS trace_session, min(step), max(step), count(DISTINCT step) FROM {TABLE} "
        f"WHERE step IS NOT NULL AND {expression} > 0 GROUP BY 1 ORDER BY 1"
    )
    return [Session(int(row[0]), int(row[1]), int(row[2]), int(row[3])) for row in result.rows]


def newest_whole(found: List[Session]) -> Optional[Session]:
    """The newest session that has a whole step (one before its newest, which is cut)."""
    for candidate in reversed(found):
        if candidate.steps >= 2:
            return candidate
    return None
