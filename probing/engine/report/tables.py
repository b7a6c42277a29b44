"""What the report shows of a job's tables, computed in DuckDB over a session holding them (a
live target's fetched tables or a record's): bounded summaries, never the raw rows, so a
1 M-row python.torch_trace or a day of process.memory samples makes a page of a few KB."""

from __future__ import annotations

from typing import Any, Dict, List, Set, Tuple

from ...errors import BadSQL
from ...sql.session import SqlSession
from ..trace_sessions import whole_steps_sql

# The steps the step-time chart shows, and the steps the slowest modules are averaged over.
STEPS_SHOWN = 300
MODULE_WINDOW_STEPS = 20
MODULES_SHOWN = 15
# Points the memory charts draw: longer histories are bucketed, each bucket keeping its peak.
MEMORY_POINTS = 600
NAN_EVENTS_SHOWN = 20
TENSORS_SHOWN = 20


# A step's time is from its start to the next traced step's start (per step, when steps between
# were not traced: `trace on --every N`), as a user reads "step time": the gap between steps
# (data loading, host work) counts. Its start is a call's ts less its offset into the step.
# `traced_s` is the end of its last traced call, the part spent in traced calls. `by` names a
# column whose values are different processes' steps (rank, for a job's tables), or is empty.
# Steps are paced within a tracing session only (trace_sessions.py): the time between the last
# step before a `trace off` and the first after the next `trace on` is time untraced, no step's.
def _steps_sql(session: SqlSession, by: str, shown: int) -> str:
    key = f"{by}, " if by else ""
    over = f"PARTITION BY {by} " if by else ""
    within = f"PARTITION BY {key}trace_session "
    return f"""
WITH {whole_steps_sql(session, by)}, per_step AS (
  SELECT {key}trace_session, step, any_value(session_newest) AS session_newest, any_value(steps) AS steps,
         max(time_offset + duration) AS traced_s, min(epoch(ts) - time_offset) AS started
  FROM bounded GROUP BY ALL
), paced AS (
  SELECT {key}step, traced_s, started, session_newest, steps,
         (lead(started) OVER ({within}ORDER BY step) - started)
           / (lead(step) OVER ({within}ORDER BY step) - step) AS seconds
  FROM per_step
), kept AS (
  SELECT {key}step, seconds, traced_s, started, row_number() OVER ({over}ORDER BY step DESC) AS age
  FROM paced WHERE step < session_newest OR steps = 1
)
SELECT {key}step, seconds, traced_s, started FROM kept WHERE age <= {shown} ORDER BY {key}step DESC
"""


# Per module over the window: seconds per step in each stage, and calls per step (the most of
# any stage: a module called once per step has one forward and one backward call, not two). Whole
# steps only (trace_sessions.py): the window is the last MODULE_WINDOW_STEPS step numbers up to
# the newest whole step.
def _modules_sql(session: SqlSession) -> str:
    return f"""
WITH {whole_steps_sql(session)},
bounds AS (SELECT max(step) AS newest FROM whole),
recent AS (SELECT w.* FROM whole w, bounds WHERE w.step > bounds.newest - {MODULE_WINDOW_STEPS}),
counted AS (SELECT count(DISTINCT step) AS steps FROM recent),
per_stage AS (
  SELECT module, any_value(module_type) AS module_type,
         CASE WHEN stage IN ('backward', 'optimizer') THEN stage ELSE 'forward' END AS stage,
         sum(duration) AS seconds, count(*) AS calls
  FROM recent WHERE module IS NOT NULL GROUP BY ALL
)
SELECT module, any_value(module_type) AS module_type,
       sum(seconds) FILTER (WHERE stage = 'forward') / any_value(counted.steps) AS forward_s,
       sum(seconds) FILTER (WHERE stage = 'backward') / any_value(counted.steps) AS backward_s,
       sum(seconds) FILTER (WHERE stage = 'optimizer') / any_value(counted.steps) AS optimizer_s,
       sum(seconds) / any_value(counted.steps) AS total_s, max(calls) AS calls,
       any_value(counted.steps) AS steps
FROM per_stage, counted GROUP BY module ORDER BY total_s DESC, module LIMIT {MODULES_SHOWN}
"""


def _memory_sql(by: str, points: int) -> str:
    key = f"{by}, " if by else ""
    over = f"PARTITION BY {by} " if by else ""
    return f"""
WITH numbered AS (
  SELECT *, row_number() OVER ({over}ORDER BY ts) - 1 AS n, count(*) OVER ({over}) AS total
  FROM process.memory WHERE ts IS NOT NULL
)
SELECT {key}epoch(min(ts)) AS ts, max(rss_mb) AS rss_mb, max(cuda_allocated_mb) AS cuda_allocated_mb,
       max(cuda_reserved_mb) AS cuda_reserved_mb, max(gc_objects) AS gc_objects
FROM numbered GROUP BY {key}n * {points} // total ORDER BY {key}ts
"""


_NAN_SQL = f"""
SELECT step, seq, module, module_type, stage, tensor, nan_count, inf_count, input_finite,
       weights_finite, weights_already_nonfinite, epoch(ts) AS ts
FROM python.nan_events ORDER BY step, seq LIMIT {NAN_EVENTS_SHOWN}
"""

# A tensor with no name is shown by what holds it (held_by, `__main__.history[17]`).
_TENSORS_SQL = f"""
SELECT coalesce(name, held_by) AS name, kind, shape, dtype, device, bytes, requires_grad, grad_fn
FROM python.tensors ORDER BY bytes DESC NULLS LAST LIMIT {TENSORS_SHOWN}
"""


def _rows(session: SqlSession, sql: str) -> List[Dict[str, Any]]:
    result = session.run(sql)
    return [dict(zip(result.columns, row)) for row in result.rows]


def _count(session: SqlSession, table: str) -> int:
    try:
        result = session.run(f"SELECT count(*) FROM {table}")
    except BadSQL:
        return 0  # not in the session: an older agent's, or a record without it
    return int(result.rows[0][0]) if result.rows else 0


def step_times(session: SqlSession, by: str = "", shown: int = STEPS_SHOWN) -> List[Dict[str, Any]]:
    """The last `shown` steps, oldest first: `seconds` from its start to the next traced
    step's (None for the last: the step after it is under way), `traced_s` to the end of its
    last traced call; the step under way left out. With `by` (rank), each value's own steps,
    each row with it (grouped by it, highest first)."""
    if _count(session, "python.torch_trace") == 0:
        return []
    return list(reversed(_rows(session, _steps_sql(session, by, shown))))


def slowest_modules(session: SqlSession) -> List[Dict[str, Any]]:
    """The modules that take longest per step over the last MODULE_WINDOW_STEPS step numbers
    (the traced ones among them: `steps`): seconds per step in forward, backward and optimizer
    apart, slowest first."""
    if _count(session, "python.torch_trace") == 0:
        return []
    modules = _rows(session, _modules_sql(session))
    for entry in modules:
        for key in ("forward_s", "backward_s", "optimizer_s", "total_s"):
            entry[key] = float(entry[key] or 0.0)
        entry["calls"] = int(entry["calls"] or 0)
    return modules


def memory_history(session: SqlSession, by: str = "", points: int = MEMORY_POINTS) -> List[Dict[str, Any]]:
    """process.memory as at most `points` points, oldest first (each the peak of its span); with
    `by` (rank), as many for each of its values, ordered by it, each row with it."""
    if _count(session, "process.memory") == 0:
        return []
    return _rows(session, _memory_sql(by, points))


def nan_events(session: SqlSession) -> Tuple[List[Dict[str, Any]], List[int], int]:
    """The first NAN_EVENTS_SHOWN NaN events, every step that had one (for the step chart's
    marks) and how many events there are."""
    total = _count(session, "python.nan_events")
    if total == 0:
        return [], [], 0
    steps = session.run("SELECT DISTINCT step FROM python.nan_events WHERE step IS NOT NULL ORDER BY step")
    try:
        events = _rows(session, _NAN_SQL)
    except BadSQL:  # an older agent's table (or record), without the weights' columns
        events = _rows(session, _NAN_SQL.replace("weights_finite, weights_already_nonfinite,", ""))
    return events, [int(row[0]) for row in steps.rows], total


def largest_tensors(session: SqlSession) -> List[Dict[str, Any]]:
    if _count(session, "python.tensors") == 0:
        return []
    try:
        return _rows(session, _TENSORS_SQL)
    except BadSQL:  # an older agent's table, without held_by
        return _rows(session, _TENSORS_SQL.replace("coalesce(name, held_by)", "name"))


def thread_details(session: SqlSession) -> Dict[Any, Dict[str, Any]]:
    """python.threads by Python thread ident: daemon, CPU seconds."""
    if _count(session, "python.threads") == 0:
        return {}
    rows = _rows(session, "SELECT thread_id, daemon, cpu_user_s, cpu_system_s FROM python.threads")
    return {row["thread_id"]: row for row in rows}


def held_tables(session: SqlSession, names: List[str]) -> Set[str]:
    """Those of `names` that hold rows in the session."""
    return {name for name in names if _count(session, name) > 0}
