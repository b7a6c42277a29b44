"""One verdict for a whole distributed job, from what each rank showed: its HangReport (the one
definition of hung for one process, analysis/progress.py) and, where it could give them, its
python.collectives and python.process_groups rows. Pure functions: no I/O, no processes.

Hung. The job is stuck when any rank is hung, unless collectives completed on every rank during
the window. A rank that does not progress holds every collective of the others: its peers wait
inside an all_reduce that cannot complete, so one hung rank is a hung job, and the others' own
verdicts (hung too, still in the collective) add nothing. The converse needs the exception: a
rank busy in an endless Python loop moves, so it is not hung itself, but its peers are, and the
job is stuck; a rank that waited out the whole window in a collective while a peer ran a long
step is hung by its own verdict, yet the job progresses: that shows as collectives completing on
every rank during the window (a collective created at or after `window_start` and completed), and
only then is a hung rank forgiven. Without `window_start`, or when a sampled rank gave no
collectives, the exception cannot be shown and any hung rank makes the job hung. A healthy job
between collectives has no hung rank at all. Ranks that could not be sampled are `missing`; they
decide nothing.

Behind and waiting (only for a hung job: in a progressing job they would only be ranks read a
moment apart). Per process group, the collective waited in is the lowest sequence number that
some rank has enqueued and not completed: collectives of a group complete in order, so nothing
above it can complete before it. (For a synchronous job it is also the highest one enqueued; with
async ops, ranks may have enqueued more behind it.) The ranks waiting are those with it pending;
behind are the group's members whose last enqueued sequence number is lower, each shown where its
main thread is (function, file:line, state, whether a thread of it holds the GIL). A member that
gave no collectives (the agent could not answer: a thread holds the GIL) is judged by its stack:
waiting when its main thread is inside torch.distributed, behind otherwise. When no rank gave
collectives at all (no torch.distributed, or no Flight Recorder), the same stack rule applies to
every rank. Completed means state 'completed' or a sequence number at or below the group's
`last_completed` (gloo's recorder leaves its entries 'scheduled' and counts completion there).

Mismatches (any time, not only when hung): analysis/mismatches.py, torch's Flight Recorder
analyzer first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from .mismatches import Mismatch, call_text, decoded, mismatches, sequence_number
from .progress import HangReport, ThreadReport
from .rank_ranges import ranks_text

if TYPE_CHECKING:
    from ..schema.rows import CollectivesRow, ProcessGroupsRow


class RankView(NamedTuple):
    """What one rank showed: the input of job_verdict, one per rank."""

    rank: int
    local_rank: Optional[int]
    node: Optional[int]
    pid: Optional[int]
    report: Optional[HangReport]  # None: the rank could not be sampled (`missing_reason` says why)
    missing_reason: str = ""
    collectives: Optional[List[CollectivesRow]] = None  # None: the rank could not give them
    process_groups: Optional[List[ProcessGroupsRow]] = None  # likewise
    host: Optional[str] = None  # a rank on another node: its hostname (its PID is that node's)


class Waiting(NamedTuple):
    """Ranks waiting in one collective (source flight_recorder), or seen inside torch.distributed by
    their stacks (source stack: no process group or sequence number known)."""

    ranks: List[int]
    op: str
    pg_id: Any = None
    pg_desc: str = ""
    seq: Optional[int] = None
    since: Optional[float] = None  # epoch seconds the first of them enqueued it
    waited_s: Optional[float] = None  # the longest any of them has waited
    source: str = "flight_recorder"


class BehindRank(NamedTuple):
    """A rank that has not reached the collective the others wait in, and where it is instead."""

    rank: int
    local_rank: Optional[int]
    node: Optional[int]
    pid: Optional[int]
    where: str  # its main thread's innermost Python frame: "func (file:line)"
    state: str
    activity: str
    hung: bool  # by its own verdict
    holds_gil: bool  # a thread of it was seen holding the GIL
    gil_holder: Optional[str]  # that thread's name
    pg_id: Any = None  # the collective it has not reached (None: judged by its stack)
    pg_desc: str = ""
    seq: Optional[int] = None
    op: str = ""
    last_seq: Optional[int] = None  # the last it enqueued in that group (None: unknown)
    host: Optional[str] = None  # another node's rank: its hostname


class MissingRank(NamedTuple):
    rank: int
    local_rank: Optional[int]
    node: Optional[int]
    pid: Optional[int]
    reason: str
    host: Optional[str] = None


class JobVerdict(NamedTuple):
    hung: bool
    reason: str  # the verdict in one sentence
    basis: str  # collectives (Flight Recorder rows) or stacks (none could be had)
    ranks: List[RankView]
    behind: List[BehindRank]
    waiting: List[Waiting]
    mismatches: List[Mismatch]
    missing: List[MissingRank]
    mismatch_check: str  # which check looked for mismatches, and why that one
    duration_s: float  # the longest window a rank was watched over

    def to_json(self) -> Dict[str, Any]:
        """Stable keys: hung, reason, basis, duration_s, behind, waiting, mismatches, missing,
        mismatch_check, ranks (each: rank, local_rank, node, pid, host, hung, where, state, reason);
        host is the hostname of a rank on another node, null on this one."""
        return {
            "hung": self.hung,
            "reason": self.reason,
            "basis": self.basis,
            "duration_s": round(self.duration_s, 3),
            "behind": [rank._asdict() for rank in self.behind],
            "waiting": [waiting._asdict() for waiting in self.waiting],
            "mismatches": [mismatch.to_json() for mismatch in self.mismatches],
            "missing": [missing._asdict() for missing in self.missing],
            "mismatch_check": self.mismatch_check,
            "ranks": [_rank_summary(view) for view in self.ranks],
        }


def main_thread(report: HangReport) -> Optional[ThreadReport]:
    return next((thread for thread in report.threads if thread.is_main), None) or next(
        iter(report.threads), None
    )


def _rank_summary(view: RankView) -> Dict[str, Any]:
    thread = main_thread(view.report) if view.report is not None else None
    return {
        "rank": view.rank, "local_rank": view.local_rank, "node": view.node, "pid": view.pid,
        "host": view.host, "hung": None if view.report is None else view.report.hung,
        "where": thread.where if thread else None, "state": thread.state if thread else None,
        "reason": view.report.reason if view.report is not None else view.missing_reason,
    }  # fmt: skip


def _in_collective(view: RankView) -> bool:
    """Whether the rank's main thread is inside torch.distributed (by its stack)."""
    thread = main_thread(view.report) if view.report is not None else None
    if thread is None:
        return False
    state = thread.state.split(", ", 1)[1] if thread.state.startswith("holds the GIL, ") else thread.state
    return state.startswith("in torch.distributed") or "distributed_c10d.py" in thread.where


def _behind(
    view: RankView, pending: Optional[Tuple[Any, str, int, str]], last_seq: Optional[int]
) -> BehindRank:
    report = view.report
    thread = main_thread(report) if report is not None else None
    holder = next((t for t in report.threads if t.holds_gil), None) if report is not None else None
    pg_id, pg_desc, seq, op = pending if pending is not None else (None, "", None, "")
    return BehindRank(
        view.rank, view.local_rank, view.node, view.pid,
        thread.where if thread else "(not seen)", thread.state if thread else "unknown",
        thread.activity if thread else "unknown", bool(report and report.hung),
        holder is not None, holder.name if holder else None, pg_id, pg_desc, seq, op, last_seq, view.host,
    )  # fmt: skip


class _Group(NamedTuple):
    """One process group as the ranks that gave collectives see it."""

    desc: str
    members: List[int]
    enqueued: Dict[int, int]  # rank -> last sequence number it enqueued
    completed: Dict[int, int]  # rank -> last sequence number it completed
    pending: Dict[int, Dict[int, CollectivesRow]]  # sequence number -> rank -> its row


def _groups(views: Sequence[RankView]) -> Dict[Any, _Group]:
    groups: Dict[Any, _Group] = {}
    every = sorted(view.rank for view in views)
    for view in views:
        rows = [row for row in view.collectives or [] if not row.get("is_p2p") and row.get("seq") is not None]
        status = {row["pg_id"]: row for row in view.process_groups or []}
        for pg_id in {*(row["pg_id"] for row in rows), *status}:
            mine = [row for row in rows if row["pg_id"] == pg_id]
            known = status.get(pg_id)
            first = mine[0] if mine else known
            members = decoded(first.get("pg_ranks") if first else None) or every
            desc = (first.get("pg_desc") if first else None) or ""
            group = groups.setdefault(pg_id, _Group(str(desc), list(members), {}, {}, {}))
            last_completed = (known.get("last_completed") if known else None) or 0
            done = [sequence_number(row) for row in mine if row.get("state") == "completed"]
            completed = max([last_completed, *done])
            group.completed[view.rank] = completed
            last_enqueued = (known.get("last_enqueued") if known else None) or 0
            group.enqueued[view.rank] = max([last_enqueued] + [sequence_number(row) for row in mine])
            for row in mine:
                if sequence_number(row) > completed and row.get("state") != "completed":
                    group.pending.setdefault(sequence_number(row), {})[view.rank] = row
    return groups


def _completed_in_window(view: RankView, window_start: float) -> bool:
    last = {row["pg_id"]: row.get("last_completed") or 0 for row in view.process_groups or []}
    for row in view.collectives or []:
        seq = row.get("seq")
        done = row.get("state") == "completed" or (seq is not None and seq <= last.get(row.get("pg_id"), 0))
        when = row.get("time_completed") or row.get("time_created") or 0.0
        if done and when >= window_start:
            return True
    return False


def _collective_text(op: str, seq: Optional[int], pg_id: Any, pg_desc: str) -> str:
    if seq is None:
        return op or "a collective"
    desc = f" ({pg_desc})" if pg_desc else ""
    return f"{op} #{seq} of process group {pg_id}{desc}"


def _place(behind: BehindRank) -> str:
    return f"{behind.where}, {behind.state}"


def job_verdict(
    ranks: Sequence[RankView], window_start: Optional[float], load_analyzer: Callable[[], Optional[Any]]
) -> JobVerdict:
    """The job's verdict from every rank's view (the module docstring gives the rules).

    `window_start`: epoch seconds (time.time()) when the ranks began to be watched; the exception
    for collectives completed during the window needs it (None: any hung rank makes the job hung;
    one rank of a healthy job was seen "hung" by its own 2 s verdict, so pass it).
    `load_analyzer`: mismatches.flight_recorder_analyzer, called only where there is a mismatch
    to decide (mismatches.mismatches); one that gives None leaves the comparison to ours."""
    views = sorted(ranks, key=lambda view: view.rank)
    sampled = [view for view in views if view.report is not None]
    missing = [
        MissingRank(v.rank, v.local_rank, v.node, v.pid, v.missing_reason or "could not be sampled", v.host)
        for v in views
        if v.report is None
    ]
    duration = max((view.report.duration_s for view in sampled if view.report), default=0.0)
    with_rows = {view.rank: view.collectives for view in views if view.collectives}
    found, check = mismatches({rank: rows for rank, rows in with_rows.items() if rows}, load_analyzer)
    informed = [view for view in views if view.collectives or view.process_groups]
    basis = "collectives" if informed else "stacks"
    hung_ranks = [view.rank for view in sampled if view.report and view.report.hung]

    def verdict(hung: bool, reason: str, behind: List[BehindRank], waiting: List[Waiting]) -> JobVerdict:
        return JobVerdict(hung, reason, basis, views, behind, waiting, found, missing, check, duration)

    if not sampled:
        return verdict(False, "no rank could be sampled", [], [])
    if not hung_ranks:
        return verdict(False, f"every rank progressed ({ranks_text([v.rank for v in sampled])})", [], [])
    every_rank_completed = window_start is not None and all(
        (view.collectives or view.process_groups) and _completed_in_window(view, window_start)
        for view in sampled
    )
    if every_rank_completed:
        still = ranks_text(hung_ranks)
        reason = f"{still} did not move, but collectives completed on every rank during the window"
        return verdict(False, reason, [], [])
    behind, waiting = _where_each_is(views, informed)
    return verdict(True, _reason(behind, waiting, found, missing, views), behind, waiting)


def _waiting(op: str, pg_id: Any, desc: str, seq: int, rows: Dict[int, CollectivesRow]) -> Waiting:
    created = [when for when in (row.get("time_created") for row in rows.values()) if when is not None]
    waited = [seconds for seconds in (row.get("waited") for row in rows.values()) if seconds is not None]
    return Waiting(sorted(rows), op, pg_id, desc, seq, min(created, default=None), max(waited, default=None))


def _where_each_is(views: List[RankView], informed: List[RankView]) -> Tuple[List[BehindRank], List[Waiting]]:
    """Behind and waiting ranks of a hung job: by collectives where ranks gave them, by stacks for
    the others (and for all, when none did)."""
    with_collectives = {view.rank for view in informed}
    uninformed = [view for view in views if view.rank not in with_collectives and view.report is not None]
    behind: Dict[int, BehindRank] = {}
    waiting: List[Waiting] = []
    stack_waiters = [view.rank for view in uninformed if _in_collective(view)]
    waiting_by_stack = set(stack_waiters)
    for pg_id, group in sorted(_groups(informed).items(), key=lambda item: str(item[0])):
        # A collective some rank has completed is not waited in: it completes (or did) everywhere.
        done = max(group.completed.values(), default=0)
        open_seqs = [seq for seq in group.pending if seq > done]
        if not open_seqs:
            continue
        seq = min(open_seqs)
        by_op: Dict[str, Dict[int, CollectivesRow]] = {}
        for rank, row in sorted(group.pending[seq].items()):
            by_op.setdefault(str(row.get("op")), {})[rank] = row
        for op, rows in sorted(by_op.items(), key=lambda item: -len(item[1])):
            waiting.append(_waiting(op, pg_id, group.desc, seq, rows))
        pending = (pg_id, group.desc, seq, waiting[-len(by_op)].op)
        members = set(group.members)
        for view in views:
            if view.rank not in members or view.rank in behind or view.report is None:
                continue
            last = group.enqueued.get(view.rank)
            if last is not None and last < seq:
                behind[view.rank] = _behind(view, pending, last)
            elif last is None and view.rank not in waiting_by_stack:
                behind[view.rank] = _behind(view, pending, None)
    if stack_waiters:
        first = next(main_thread(v.report) for v in uninformed if v.rank == stack_waiters[0] and v.report)
        op = first.where.split(" (", 1)[0] if first else "a collective"
        waiting.append(Waiting(stack_waiters, op, source="stack"))
    if not waiting:
        # Nobody waits in a collective: where the job stopped is wherever its hung ranks are.
        for view in views:
            if view.report is not None and view.report.hung and not _in_collective(view):
                behind.setdefault(view.rank, _behind(view, None, None))
    elif not informed:
        for view in uninformed:
            if view.rank not in waiting_by_stack:
                behind.setdefault(view.rank, _behind(view, None, None))
    return [behind[rank] for rank in sorted(behind)], waiting


def _reason(
    behind: List[BehindRank], waiting: List[Waiting], found: List[Mismatch], missing: List[MissingRank],
    views: List[RankView],
) -> str:  # fmt: skip
    """The hung job's verdict in one sentence: a mismatch at the collective waited in, else the
    ranks behind it and where they are, else who waits and for whom nobody knows."""
    blocked = {(entry.pg_id, entry.seq) for entry in waiting if entry.seq is not None}
    mismatch = next((mismatch for mismatch in found if (mismatch.pg_id, mismatch.seq) in blocked), None)
    if mismatch is not None:
        return _mismatch_text(mismatch)
    target = next((w for w in waiting if w.source == "flight_recorder"), None) or next(iter(waiting), None)
    if target is None:
        if behind:
            hung = "; ".join(f"rank {rank.rank} is hung in {_place(rank)}" for rank in behind)
            return f"no rank waits in a collective; {hung}"
        hung_ranks = [view.rank for view in views if view.report is not None and view.report.hung]
        return f"{ranks_text(hung_ranks)} did not progress"
    collective = _collective_text(target.op, target.seq, target.pg_id, target.pg_desc)
    waiters = ranks_text(target.ranks)
    if not behind:
        wait = "waits" if len(target.ranks) == 1 else "wait"
        if missing:
            unseen = ranks_text([rank.rank for rank in missing])
            return f"{waiters} {wait} in {collective}; {unseen} could not be sampled ({missing[0].reason})"
        return f"{waiters} {wait} in {collective}, which no rank is behind for and none completes"
    one = len(behind) == 1
    names = ranks_text([rank.rank for rank in behind])
    if target.source == "stack":
        wait = "waits" if len(target.ranks) == 1 else "wait"
        head = f"{names} {'is' if one else 'are'} not in a collective while {waiters} {wait} in {collective}"
    else:
        wait = "waits" if len(target.ranks) == 1 else "wait"
        head = f"{names} {'has' if one else 'have'} not reached {collective} that {waiters} {wait} in"
    if one:
        return f"{head}; it is in {_place(behind[0])}"
    # Ranks behind in the same place are said once (a whole node behind is one clause).
    places: Dict[str, List[int]] = {}
    for rank in behind:
        places.setdefault(_place(rank), []).append(rank.rank)
    clauses = (
        f"{ranks_text(numbers)} {'is' if len(numbers) == 1 else 'are'} in {place}"
        for place, numbers in places.items()
    )
    return f"{head}; " + "; ".join(clauses)


def _mismatch_text(mismatch: Mismatch) -> str:
    calls = ", ".join(
        f"{ranks_text(call.ranks)} call{'' if len(call.ranks) > 1 else 's'} {call_text(call, kind)}"
        for call, kind in ((call, mismatch.kind) for call in mismatch.calls)
    )
    where = _collective_text("collective", mismatch.seq, mismatch.pg_id, mismatch.pg_desc)
    return f"{where} does not match across ranks: {calls}"
