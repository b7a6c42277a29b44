"""`probing PID hang --ranks all`: the whole job's verdict (analysis/collectives.py), for a person
in an incident (the verdict first, then the ranks behind and where they are, who waits in what,
mismatched collectives, ranks that could not be sampled) or as JSON (JobVerdict.to_json)."""

from __future__ import annotations

import json
import sys
from typing import IO, Any, List, Optional, Sequence

from ...analysis.rank_ranges import rank_numbers
from . import inert, notes
from .json_writer import write_json
from .rows import write_table


def write_job_hang(verdict: Any, format: str, out: Optional[IO[str]] = None) -> None:
    """`verdict`: an analysis.collectives.JobVerdict."""
    if format == "json":
        write_json(verdict.to_json(), out)
        return
    if verdict.mismatch_check.startswith("compared by probing (") and verdict.mismatches:
        # Which check found them matters to whoever reads on: say it once, as a note.
        notes([f"mismatched collectives {verdict.mismatch_check}"])
    out = out or sys.stdout
    sampled = [view.rank for view in verdict.ranks if view.report is not None]
    watched = f" ({_count(len(sampled), 'rank')} watched for {verdict.duration_s:.1f} s)" if sampled else ""
    state = "hung" if verdict.hung else "progressing"
    out.write(f"The job is {state}: {inert(verdict.reason)}{watched}\n")
    if verdict.behind:
        out.write("\nBehind (not at the collective the others wait in):\n")
        rows: List[Sequence[Any]] = [
            (rank.rank, pid_text(rank), rank.where, gil_text(rank), rank.activity, reached_text(rank))
            for rank in verdict.behind
        ]
        _table(["rank", "pid", "where", "state", "activity", "last collective"], rows, out)
    if verdict.waiting:
        out.write("\nWaiting:\n")
        rows = [
            (_ranks(waiting.ranks), collective_text(waiting), _seconds(waiting.waited_s))
            for waiting in verdict.waiting
        ]
        _table(["ranks", "in", "for"], rows, out)
    if verdict.mismatches:
        out.write("\nMismatched collectives (the same sequence number, not the same call):\n")
        rows = [
            (group_text(mismatch.pg_id, mismatch.pg_desc), mismatch.seq, mismatch.kind, _ranks(call.ranks),
             call.op, compact_text(call.input_sizes), compact_text(call.input_dtypes))
            for mismatch in verdict.mismatches
            for call in mismatch.calls
        ]  # fmt: skip
        _table(["process group", "seq", "differs in", "ranks", "op", "sizes", "dtypes"], rows, out)
    if verdict.missing:
        out.write("\nNot sampled:\n")
        _table(
            ["rank", "pid", "why"],
            [(rank.rank, pid_text(rank), rank.reason) for rank in verdict.missing],
            out,
        )


def _table(columns: List[str], rows: Sequence[Sequence[Any]], out: IO[str]) -> None:
    # write_table makes every cell inert: where, state, ops and reasons come from the job.
    write_table(columns, ["VARCHAR"] * len(columns), [[_text(value) for value in row] for row in rows], out)


def pid_text(rank: Any) -> str:
    """A rank on another node: its PID is that node's, so the node goes with it."""
    if rank.pid is None or not rank.host:
        return _text(rank.pid)
    return f"{rank.pid} on {rank.host}"


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _count(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _ranks(ranks: Sequence[int]) -> str:
    return rank_numbers(ranks)


def group_text(pg_id: Any, desc: str) -> str:
    return f"{pg_id} ({desc})" if desc else str(pg_id)


def collective_text(waiting: Any) -> str:
    if waiting.seq is None:
        return f"{waiting.op} (seen in the stack)"
    return f"{waiting.op} #{waiting.seq} of process group {group_text(waiting.pg_id, waiting.pg_desc)}"


def gil_text(rank: Any) -> str:
    if rank.holds_gil and not rank.state.startswith("holds the GIL"):
        return f"{rank.state}; thread {rank.gil_holder!r} holds the GIL"
    return str(rank.state)


def reached_text(rank: Any) -> str:
    if rank.seq is None:
        return "not in a collective (by its stack)"
    last = "unknown (it gave no collectives)" if rank.last_seq is None else f"#{rank.last_seq}"
    return f"{last}; not #{rank.seq} ({rank.op})"


def _seconds(value: Optional[float]) -> str:
    return "?" if value is None else f"{value:.1f} s"


def compact_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
