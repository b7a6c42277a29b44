"""What the report shows of a job's tables, computed in DuckDB over a session holding them (a
live target's fetched tables or a record's): bounded summaries, never the raw rows, so a
1 M-row python.torch_trace or a day of process.memory samples makes a page of a few KB."""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Set, Tuple

from ..errors import BadSQL
from ..sql.session import SqlSession

# The steps the step-time chart shows, and the steps the slowest modules are averaged over.
STEPS_SHOWN = 300
MODULE_WINDOW_STEPS = 20
MODULES_SHOWN = 15
# Points the memory charts draw: longer histories are bucketed, each bucket keeping its peak.
MEMORY_POINTS = 600
NAN_EVENTS_SHOWN = 20
TENSORS_SHOWN = 20

_STEPS_SQL = f"""
WITH per_step AS (
  SELECT step, max(time_offset + duration) AS seconds, epoch(min(ts)) AS started
  FROM python.torch_trace WHERE step IS NOT NULL GROUP BY step
), newest AS (SELECT max(step) AS step, count(*) AS steps FROM per_step)
SELECT per_step.step, seconds, started FROM per_step, newest
WHERE newest.steps = 1 OR per_step.step < newest.step
ORDER BY per_step.step DESC LIMIT {STEPS_SHOWN}
"""

_MODULES_SQL = f"""
WITH bounds AS (SELECT max(step) AS newest, count(DISTINCT step) AS steps FROM python.torch_trace),
recent AS (
  SELECT t.* FROM python.torch_trace t, bounds
  WHERE t.step > bounds.newest - {MODULE_WINDOW_STEPS + 1}
    AND (bounds.steps = 1 OR t.step < bounds.newest)
), counted AS (SELECT count(DISTINCT step) AS steps FROM recent)
SELECT module, any_value(module_type) AS module_type, stage,
       sum(duration) / any_value(counted.steps) AS per_step, count(*) AS calls,
       any_value(counted.steps) AS steps
FROM recent, counted WHERE module IS NOT NULL GROUP BY module, stage
"""

_MEMORY_SQL = f"""
WITH numbered AS (
  SELECT *, row_number() OVER (ORDER BY ts) - 1 AS n, count(*) OVER () AS total
  FROM process.memory WHERE ts IS NOT NULL
)
SELECT epoch(min(ts)) AS ts, max(rss_mb) AS rss_mb, max(cuda_allocated_mb) AS cuda_allocated_mb,
       max(cuda_reserved_mb) AS cuda_reserved_mb, max(gc_objects) AS gc_objects
FROM numbered GROUP BY n * {MEMORY_POINTS} // total ORDER BY ts
"""

_NAN_SQL = f"""
SELECT step, seq, module, module_type, stage, tensor, nan_count, inf_count, input_finite,
       epoch(ts) AS ts
FROM python.nan_events ORDER BY step, seq LIMIT {NAN_EVENTS_SHOWN}
"""

_TENSORS_SQL = f"""
SELECT name, kind, shape, dtype, device, bytes, requires_grad, grad_fn
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


def step_times(session: SqlSession) -> List[Dict[str, Any]]:
    """The last STEPS_SHOWN steps, oldest first: how long each took (its last call's end),
    the step under way left out."""
    if _count(session, "python.torch_trace") == 0:
        return []
    return list(reversed(_rows(session, _STEPS_SQL)))


def slowest_modules(session: SqlSession) -> List[Dict[str, Any]]:
    """The modules that take longest per step over the last MODULE_WINDOW_STEPS whole steps:
    seconds per step in forward, backward and optimizer apart, slowest first."""
    if _count(session, "python.torch_trace") == 0:
        return []
    modules: Dict[str, Dict[str, Any]] = {}
    for row in _rows(session, _MODULES_SQL):
        entry = modules.setdefault(
            row["module"],
            {"module": row["module"], "module_type": row["module_type"], "forward_s": 0.0,
             "backward_s": 0.0, "optimizer_s": 0.0, "calls": 0, "steps": row["steps"]},
        )  # fmt: skip
        stage = row["stage"] if row["stage"] in ("forward", "backward", "optimizer") else "forward"
        entry[f"{stage}_s"] += float(row["per_step"] or 0.0)
        entry["calls"] += int(row["calls"] or 0)
    for entry in modules.values():
        entry["total_s"] = entry["forward_s"] + entry["backward_s"] + entry["optimizer_s"]
    ranked = sorted(modules.values(), key=lambda entry: -entry["total_s"])
    return ranked[:MODULES_SHOWN]


def memory_history(session: SqlSession) -> List[Dict[str, Any]]:
    """process.memory as at most MEMORY_POINTS points, oldest first (each the peak of its span)."""
    if _count(session, "process.memory") == 0:
        return []
    return _rows(session, _MEMORY_SQL)


def nan_events(session: SqlSession) -> Tuple[List[Dict[str, Any]], List[int], int]:
    """The first NAN_EVENTS_SHOWN NaN events, every step that had one (for the step chart's
    marks) and how many events there are."""
    total = _count(session, "python.nan_events")
    if total == 0:
        return [], [], 0
    steps = session.run("SELECT DISTINCT step FROM python.nan_events WHERE step IS NOT NULL ORDER BY step")
    return _rows(session, _NAN_SQL), [int(row[0]) for row in steps.rows], total


def largest_tensors(session: SqlSession) -> List[Dict[str, Any]]:
    if _count(session, "python.tensors") == 0:
        return []
    return _rows(session, _TENSORS_SQL)


def thread_details(session: SqlSession) -> Dict[Any, Dict[str, Any]]:
    """python.threads by Python thread ident: daemon, CPU seconds."""
    if _count(session, "python.threads") == 0:
        return {}
    rows = _rows(session, "SELECT thread_id, daemon, cpu_user_s, cpu_system_s FROM python.threads")
    return {row["thread_id"]: row for row in rows}


def held_tables(session: SqlSession, names: List[str]) -> Set[str]:
    """Those of `names` that hold rows in the session."""
    return {name for name in names if _count(session, name) > 0}


def torch_version_of(pid: Optional[int]) -> Optional[str]:
    """The torch version a local process has loaded, read from outside: the torch package its
    memory maps show (libtorch's directory), then that package's version.py. Nothing runs in
    the job; None when it has no torch loaded or the files cannot be read."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
            package = None
            for line in handle:
                path = line.rstrip("\n").split(" ", 5)[-1].strip()
                marker = path.rfind("/torch/lib/")
                if marker >= 0:
                    package = path[: marker + len("/torch")]
                    break
        if package is None:
            return None
        with open(os.path.join(package, "version.py"), encoding="utf-8", errors="replace") as handle:
            source = handle.read(8192)
    except OSError:
        return None
    found = re.search(r"""^__version__\s*=\s*['"]([^'"]{1,64})['"]""", source, re.MULTILINE)
    return found.group(1) if found else None
