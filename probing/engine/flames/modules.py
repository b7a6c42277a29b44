"""The module flame graph of a torch job: python.torch_trace (live or from a record) as the
module hierarchy, each module as wide as its mean time per step, forward, backward and the
optimizer apart."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...errors import ProbingError, UsageError
from ..query import load_tables
from ..requests import switch
from ..target import Target
from ..timeline import parse_steps as parse_step_range
from ..trace_sessions import newest_whole, session_expression, sessions
from .sampled import Flame


def parse_steps(text: Optional[str]) -> Optional[Tuple[Optional[int], Optional[int]]]:
    """`--steps A:B`, `A:`, `:B` or `N`, both ends included: trace export's reading."""
    if text is None:
        return None
    try:
        chosen = parse_step_range(text)
    except ValueError as error:
        raise UsageError(f"--steps {text!r}: {error}; give A:B, A:, :B or N") from None
    return chosen.first, chosen.last


def steps_clause(steps: Optional[Tuple[Optional[int], Optional[int]]]) -> str:
    if steps is None:
        return ""
    parts = []
    if steps[0] is not None:
        parts.append(f"step >= {int(steps[0])}")
    if steps[1] is not None:
        parts.append(f"step <= {int(steps[1])}")
    return " AND ".join(parts)


def module_sql(where: str) -> str:
    """Per module and stage: total seconds, calls, and the steps the rows span."""
    condition = f"WHERE {where}" if where else ""
    return (
        "SELECT stage, module, any_value(module_type) AS module_type, sum(duration) AS total, "
        "count(*) AS calls, (SELECT count(DISTINCT step) FROM python.torch_trace "
        f"{condition}) AS steps FROM python.torch_trace {condition} GROUP BY stage, module"
    )


def step_range_sql() -> str:
    return "SELECT min(step), max(step), count(DISTINCT step) FROM python.torch_trace"


def default_steps(low: Optional[int], high: Optional[int], count: int) -> Tuple[Optional[int], Optional[int]]:
    """Whole steps only: the newest is still running and the first may have begun before tracing did."""
    if low is None or high is None or count < 2:
        return low, high
    if count == 2:
        return low, low
    return low + 1, high - 1


def _chosen_rows(
    session: Any,
    chosen: Optional[Tuple[Optional[int], Optional[int]]],
    held: Tuple[Any, Any, int],
    notes: List[str],
) -> Tuple[str, Tuple[Optional[int], Optional[int]]]:
    """The WHERE condition of the rows drawn, and the steps they are (for the title). Whole steps
    only (trace_sessions.py): by default those of the newest tracing session, so that a mean per
    step is not taken over two sessions with the time tracing was off between them; with
    `--steps`, the whole steps among those chosen."""
    low, high, count = held
    expression = session_expression(session)
    if expression == "1":  # an agent older than tracing sessions: the first and newest steps may be cut
        chosen = chosen if chosen is not None else default_steps(low, high, count)
        return steps_clause(chosen), chosen
    found = sessions(session)
    if chosen is not None:
        # Each session's newest step was cut by `trace off` (or is under way), unless it is all there is.
        cut = " OR ".join(f"(session = {each.number} AND step = {each.last})" for each in found)
        whole = f"NOT ({cut})" if cut and sum(each.steps for each in found) > 1 else ""
        return " AND ".join(part for part in (steps_clause(chosen), "session > 0", whole) if part), chosen
    newest = newest_whole(found)
    if newest is None:  # no step is whole yet: the one under way (or, with none, what there is)
        if not found:
            return "", (low, high)
        return f"session = {found[-1].number}", (found[-1].first, found[-1].last)
    if len(found) > 1:
        others = ", ".join(f"{each.first}-{each.last}" for each in found if each != newest)
        notes.append(
            f"the whole steps of tracing session {newest.number} only: tracing was off between "
            f"sessions, and the other sessions' steps ({others}) are left out; --steps A:B draws them"
        )
    condition = f"session = {newest.number} AND step >= {newest.first} AND step < {newest.last}"
    return condition, (newest.first, newest.last - 1)


STAGES = ("forward", "backward", "optimizer")
# Children that outlast their module by less than this share of it (and at most by
# CLAMP_NOTED_S) are the hooks' own timing noise: autograd may start a child's backward hook
# before its parent's, and a loaded machine stretches that. Clamped without a note.
CLAMP_NOTED_SHARE = 0.05
CLAMP_NOTED_S = 100e-6


def module_stacks(rows: Sequence[Sequence[Any]]) -> Tuple[List[Tuple[Tuple[str, ...], float]], int]:
    """The module hierarchy as stacks weighted by self time (mean seconds per step), from
    module_sql rows (stage, module, module_type, total, calls, steps): a module's parent is the
    longest traced name that prefixes it (model.layers.0 under model.layers under model);
    its self time is its own time less its children's, never below 0. Returns the stacks and
    how many modules' children took clearly longer than the module itself (clamped at 0)."""
    own: Dict[Tuple[str, str], float] = {}
    types: Dict[Tuple[str, str], str] = {}
    for stage, module, module_type, total, _calls, steps in rows:
        if not isinstance(module, str) or not isinstance(stage, str) or total is None:
            continue
        own[(stage, module)] = float(total) / max(1, int(steps or 1))
        types[(stage, module)] = str(module_type or "")
    parent: Dict[Tuple[str, str], Optional[Tuple[str, str]]] = {}
    for stage, module in own:
        found = None
        cut = module
        while "." in cut:
            cut = cut.rsplit(".", 1)[0]
            if (stage, cut) in own:
                found = (stage, cut)
                break
        parent[(stage, module)] = found
    children_time: Dict[Tuple[str, str], float] = {}
    for key, up in parent.items():
        if up is not None:
            children_time[up] = children_time.get(up, 0.0) + own[key]
    clamped = 0
    stacks: List[Tuple[Tuple[str, ...], float]] = []
    order = {stage: position for position, stage in enumerate(STAGES)}
    for key in sorted(own, key=lambda item: (order.get(item[0], len(STAGES)), item[0], item[1])):
        left = own[key] - children_time.get(key, 0.0)
        if left < 0:
            clamped += -left > max(CLAMP_NOTED_SHARE * own[key], CLAMP_NOTED_S)
            left = 0.0
        path: List[str] = []
        at: Optional[Tuple[str, str]] = key
        while at is not None:
            kind = types.get(at)
            path.append(f"{at[1]} ({kind})" if kind and at[0] != "optimizer" else at[1])
            at = parent[at]
        stacks.append(((key[0], *reversed(path)), left))
    return stacks, clamped


class NothingTraced(ProbingError):
    """python.torch_trace holds no rows."""


def torch_flame(session: Any, steps_text: Optional[str], title: str, notes: List[str]) -> Flame:
    """The module flame graph from a DuckDB session holding python.torch_trace."""
    low, high, count = session.run(step_range_sql()).rows[0]
    if not count:
        raise NothingTraced(
            "python.torch_trace has no rows: nothing was traced",
            hint="`probing PID trace on` (add --backward for backward times) starts tracing; "
            "run the flame graph after a few steps",
        )
    notes = list(notes)
    chosen = parse_steps(steps_text)
    where, chosen = _chosen_rows(session, chosen, (low, high, int(count)), notes)
    rows = session.run(module_sql(where)).rows
    if not rows:
        raise ProbingError(
            f"python.torch_trace has no rows for --steps {steps_text} (it holds steps {low}-{high})"
        )
    stacks, clamped = module_stacks(rows)
    spanned = int(rows[0][5] or 0)
    first, last = chosen
    shown = f"steps {first if first is not None else low}-{last if last is not None else high}"
    if clamped:
        one = clamped == 1
        notes.append(
            f"{clamped} module{'' if one else 's'} took less time than {'its' if one else 'their'} children: "
            "self time shown as 0"
        )
    stages = {stack[0][0] for stack in stacks}
    if "backward" not in stages:
        notes.append("no backward times: `probing PID trace on --backward` records them")
    figures = {"steps": spanned, "range": shown, "modules": len(stacks)}
    return Flame(stacks, "seconds", f"{title}: mean time per step by module, {shown}", notes, figures)


def torch_flame_of_target(target: Target, steps_text: Optional[str], timeout: float) -> Flame:
    loaded = load_tables(target, "SELECT * FROM python.torch_trace", timeout)
    try:
        return torch_flame(loaded.session, steps_text, f"PID {loaded.pid}", loaded.notes)
    except NothingTraced:
        switch(target, "trace", {"action": "status"}, timeout)  # NoTorch: a job without torch
        raise


def torch_flame_of_record(record: Any, steps_text: Optional[str]) -> Flame:
    from ..records.sql import notes_about, record_session  # DuckDB, ~60 ms: for records alone

    notes = notes_about(record.notes, ["python.torch_trace"])  # the one table it reads
    return torch_flame(record_session(record), steps_text, os.path.basename(record.path), notes)
