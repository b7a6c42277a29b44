"""`probing PID stragglers`: the job's verdict first (the stragglers in order, or none, or stuck),
then each rank's step, computing and waiting, and how often it came last; or the same as JSON."""

from __future__ import annotations

import statistics
import sys
from typing import IO, Any, Dict, List, Optional, Tuple

from ...analysis.rank_ranges import rank_runs, ranks_text
from ...analysis.stragglers import LATE_MAJORITY, MIN_COMPARED, RankTiming, Straggler, Verdict
from . import inert
from .json_writer import write_json
from .rows import write_table


def write_stragglers(verdict: Verdict, format: str, out: Optional[IO[str]] = None) -> None:
    if format == "json":
        write_json(verdict_json(verdict), out)
        return
    out = out or sys.stdout
    step = f", a step every {verdict.step_s * 1e3:.1f} ms" if verdict.step_s else ""
    per_step = f" ({verdict.period} a step)" if verdict.step_s and verdict.period > 1 else ""
    group = f" of process group {inert(verdict.pg_id)}" if verdict.pg_id is not None else ""
    out.write(
        f"Watched {len(verdict.ranks)} ranks for {verdict.window_s:.1f} s: "
        f"{verdict.compared} {inert(verdict.op)}s{group} compared{per_step}{step}.\n"
    )
    title = "Straggler" if len(verdict.stragglers) == 1 else "Stragglers"
    lines = verdict_line(verdict).split("\n")
    head = f"{title}: " if verdict.stragglers else ""
    out.write(
        "".join(
            f"{head if index == 0 else ' ' * len(head)}{inert(line)}\n" for index, line in enumerate(lines)
        )
    )
    if verdict.ranks and verdict.step_s:
        out.write("\n")
        shown, rest = _rows_shown(verdict)
        rows = [
            (t.rank, _text(t.node), _ms(t.step_s), _ms(t.computing_s), _ms(t.waiting_s),
             f"{t.last_share:.0%}", _ms(t.delay_s), f"{t.late_share:.0%}")
            for t in shown
        ]  # fmt: skip
        columns = ["rank", "node", "step", "computing", "waiting", "last to arrive", "late by", "late to"]
        write_table(columns, ["VARCHAR"] * len(columns), rows, out)
        if rest:
            out.write(f"{rest_line(rest)}\n")
    if verdict.missing:
        out.write("\nNot watched:\n")
        write_table(["rank", "why"], ["VARCHAR", "VARCHAR"], _missing_rows(verdict.missing), out)


# Past this many ranks the table has a row for the stragglers and for the ranks late to the most
# collectives (SHOWN_RANKS in all; among equals the lowest numbers), and one line for the rest:
# 1 024 rows would bury the verdict.
TABLE_RANKS = 32
SHOWN_RANKS = 16


def _rows_shown(verdict: Verdict) -> Tuple[List[RankTiming], List[RankTiming]]:
    """The ranks that get a row (in rank order), and those summed up in one line."""
    if len(verdict.ranks) <= TABLE_RANKS:
        return list(verdict.ranks), []
    named = {straggler.rank for straggler in verdict.stragglers}
    latest = sorted(verdict.ranks, key=lambda t: (t.rank not in named, -t.late_share, t.rank))
    count = max(SHOWN_RANKS, len(named))
    return sorted(latest[:count], key=lambda t: t.rank), sorted(latest[count:], key=lambda t: t.rank)


def rest_line(rest: List[RankTiming]) -> str:
    """The ranks without a row, in one line: their median step and wait, the latest of them."""
    steps = [t.step_s for t in rest if t.step_s is not None]
    waits = [t.waiting_s for t in rest if t.waiting_s is not None]
    medians = "".join(
        f", {name} {_ms(statistics.median(values))} median"
        for name, values in (("step", steps), ("waiting", waits))
        if values
    )
    last = max(t.last_share for t in rest)
    return (
        f"... and {len(rest)} more ({ranks_text([t.rank for t in rest])}){medians}, last to arrive at "
        f"{last:.0%} at most; `--format json` has every rank"
    )


def _missing_rows(missing: List[Tuple[int, str]]) -> List[Tuple[str, str]]:
    """A row per rank not watched, or past TABLE_RANKS a row per reason with its ranks."""
    if len(missing) <= TABLE_RANKS:
        return [(str(rank), why) for rank, why in missing]
    said: Dict[str, List[int]] = {}
    for rank, why in missing:
        said.setdefault(why, []).append(rank)
    return [(rank_runs(ranks, 2), why) for why, ranks in said.items()]


def _ms(value: Optional[float]) -> str:
    return "" if value is None else f"{value * 1e3:.1f} ms"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def verdict_json(verdict: Verdict) -> Dict[str, Any]:
    if verdict.stuck is not None:
        state = "stuck"
    elif verdict.stragglers:
        state = "stragglers"
    else:
        state = "no straggler" if verdict.step_s is not None else "no verdict"
    stragglers: List[Dict[str, Any]] = [
        dict(each._asdict(), verdict=straggler_line(each, verdict.op)) for each in verdict.stragglers
    ]
    return {
        "verdict": state,
        "summary": verdict_line(verdict),
        "window_s": verdict.window_s,
        "op": verdict.op,
        "pg_id": verdict.pg_id,
        "compared": verdict.compared,
        "collectives_per_step": verdict.period,
        "step_s": verdict.step_s,
        "late_floor_s": verdict.floor_s,
        "stragglers": stragglers,
        "stuck": verdict.stuck._asdict() if verdict.stuck is not None else None,
        "ranks": [timing._asdict() for timing in verdict.ranks],
        "missing": [{"rank": rank, "reason": reason} for rank, reason in verdict.missing],
    }


def verdict_line(verdict: Verdict) -> str:
    """The verdict in one sentence (or one per straggler)."""
    if verdict.stuck is not None:
        stuck = verdict.stuck
        places = [
            f"rank {rank} in {frame_text(stuck.where[rank])}" for rank in stuck.behind if rank in stuck.where
        ]
        at = f" ({'; '.join(places)})" if places else ""
        behind = f"; {ranks_text(stuck.behind)} never arrived{at}" if stuck.behind else ""
        return (
            f"the job is stuck, not slow: {ranks_text(stuck.waiting)} waited {stuck.waited_s:.1f} s in "
            f"{stuck.op} #{stuck.seq} (group {stuck.pg_id}){behind}; `hang --ranks all` says where"
        )
    if verdict.compared < MIN_COMPARED:
        return f"too few collectives to compare in {verdict.window_s:.1f} s ({verdict.compared}): no verdict"
    if not verdict.stragglers:
        return no_straggler_line(verdict)
    return "\n".join(straggler_line(each, verdict.op) for each in verdict.stragglers)


def no_straggler_line(verdict: Verdict) -> str:
    """Why no rank was named: the bar, and the rank that came nearest to it."""
    bar = f"{LATE_MAJORITY:.0%} of the {verdict.op}s by {verdict.floor_s * 1e3:.1f} ms or more"
    line = f"no straggler: no rank is late to {bar}"
    if not verdict.ranks:
        return line
    nearest = max(verdict.ranks, key=lambda timing: (timing.delay_s, timing.late_share))
    return line + (
        f"; the latest, rank {nearest.rank}, is late to {nearest.late_share:.0%} of them by "
        f"{nearest.delay_s * 1e3:.1f} ms median"
    )


def straggler_line(straggler: Straggler, op: str, no_phase: str = "its stacks could not be sampled") -> str:
    late = f"{straggler.late_share:.0%} of {op}s by {straggler.delay_s * 1e3:.0f} ms median"
    waits = f"the job waits for it {straggler.job_share:.0%} of its step time"
    line = f"rank {straggler.rank} is late to {late}; {waits}"
    if straggler.phase is None:
        return f"{line}; {no_phase}"
    where = f" ({frame_text(straggler.frame)})" if straggler.frame else ""
    return line + f"; it spends the extra time in {straggler.phase}{where}"


def frame_text(frame: str) -> str:
    """`function (file:line)` as a sentence names it: `function`, file:line."""
    function, _, place = frame.rpartition(" (")
    return f"`{function}`, {place[:-1]}" if function and place.endswith(")") else frame
