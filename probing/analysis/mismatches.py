"""Collectives that do not match across ranks: at one (process group, sequence number), ranks that
called different ops, or the same op on different sizes or dtypes. Pure functions over
python.collectives rows (one list per rank).

torch's own Flight Recorder analyzer (`torch.distributed.flight_recorder`, the `torchfrtrace`
command) decides first, where torch is importable in the CLI's process: its `build_db` is given the
rows rebuilt as the dumps it reads. Measured on live gloo jobs of tests/targets/ranks_job.py
(docs/decisions.md has the figures), what it does and does not give:

- it finds a collective called as another op (COLLECTIVE_TYPE_MISMATCH) or on other sizes or dtypes
  at the same sequence number, on a live trace whose last collective has not completed anywhere;
- it compares the state of each rank's entry too (COLLECTIVE_STATE_MISMATCH): on a live job one
  rank has completed a collective that another has only scheduled, which is no fault, so every
  entry is handed to it as `scheduled` and that kind is never reported;
- after the first unmatched collective of a group it counts every later one of that group as an
  error and stops at `mismatch_cap`: ranks caught a few steps apart (a healthy job read rank by
  rank) would end its analysis early, so the cap is lifted and its "missing ranks" are not used
  (which rank is behind is decided from sequence numbers, in analysis/collectives.py);
- it aligns ranks by `record_id`, the position in each rank's own buffer, which differs between
  ranks in different process groups: each group is cut here to the sequence numbers every rank
  still holds (a ring buffer that wrapped starts mid-run), and record ids are renumbered;
- it names the rank it met first as right and the others as culprits: the ranks are grouped here
  by what each called, so that "rank 2 called broadcast where 0, 1, 3 called all_reduce" reads the
  same whichever rank is listed first;
- it raises (AssertionError, KeyError) on ops it does not know and on process groups whose
  description differs across ranks, and may log or exit: it runs silenced and contained.

Where torch is not importable, or the analyzer fails, ours compares op, sizes and dtypes at equal
(process group, sequence number) itself: the op always; sizes and dtypes only for ops whose
tensors must agree on every rank (not gather, scatter or all_to_all, whose sizes differ by design).
Point-to-point ops (send/recv) are left out of both: their sequence numbers count per pair.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from .rank_ranges import ranks_text

if TYPE_CHECKING:
    from ..schema.rows import CollectivesRow

Rows = List["CollectivesRow"]

# The dump format the analyzer is told it reads: what torch 2.13's recorder writes ("2.10").
FLIGHT_RECORDER_VERSION = "2.10"
# The analyzer takes ~1.2 s over 8 ranks' full buffers (2000 entries each, the default) and ~0.1 s
# over their last 256: a collective that does not match stops the job there, so the recent ones
# are where it is.
COMPARED_SEQUENCE_NUMBERS = 256
# Ops whose tensors have the same sizes and dtypes on every rank of the group.
_SAME_TENSORS = {
    "all_reduce", "allreduce", "broadcast", "reduce", "all_gather", "allgather", "_allgather_base",
    "all_gather_into_tensor", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor",
    "allreduce_coalesced", "barrier",
}  # fmt: skip
# mismatch_check where every rank made the same calls, each compared whole by ours.
SAME_CALLS = "compared by probing: every rank made the same call (op, sizes, dtypes) at each sequence number"
# The analyzer's kinds of mismatch, as ours names them; others (state, undecided) are not faults.
_KINDS = {
    "COLLECTIVE_TYPE_MISMATCH": "op",
    "SIZE_OR_SYNTAX_MISMATCH": "sizes",
    "COLLECTIVE_DTYPE_MISMATCH": "dtypes",
}


class Call(NamedTuple):
    """What some ranks called at one (process group, sequence number)."""

    ranks: List[int]
    op: str
    input_sizes: Any
    input_dtypes: Any
    output_sizes: Any
    output_dtypes: Any


class Mismatch(NamedTuple):
    pg_id: Any
    pg_desc: str
    seq: int
    kind: str  # op, sizes or dtypes
    calls: List[Call]  # the largest group first
    detail: str  # the analyzer's own words, or ours
    source: str  # flight_recorder or probing

    def to_json(self) -> Dict[str, Any]:
        return dict(self._asdict(), calls=[call._asdict() for call in self.calls])


def decoded(value: Any) -> Any:
    """A JSON-text column (sizes, dtypes, ranks) as its value; anything else as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _collective_rows(rows: Rows) -> Rows:
    return [row for row in rows if not row.get("is_p2p") and row.get("seq") is not None]


def sequence_number(row: CollectivesRow) -> int:
    """The seq of a row _collective_rows kept: it has one (-1, before any, for one without)."""
    seq = row["seq"]
    return -1 if seq is None else seq


def _comparable(by_rank: Dict[int, Rows]) -> Dict[int, Rows]:
    """Each rank's rows cut, per process group, to the sequence numbers every rank still holds,
    and to the last COMPARED_SEQUENCE_NUMBERS of them."""
    first: Dict[Any, int] = {}
    for rows in by_rank.values():
        lowest: Dict[Any, int] = {}
        for row in rows:
            seq = sequence_number(row)
            lowest[row["pg_id"]] = min(lowest.get(row["pg_id"], seq), seq)
            first[row["pg_id"]] = max(first.get(row["pg_id"], 0), seq - COMPARED_SEQUENCE_NUMBERS + 1)
        for pg_id, seq in lowest.items():
            first[pg_id] = max(first[pg_id], seq)
    return {
        rank: sorted(
            (row for row in rows if sequence_number(row) >= first[row["pg_id"]]),
            key=lambda row: (row.get("record_id") or 0, sequence_number(row)),
        )
        for rank, rows in by_rank.items()
    }


def _in_order(rows: Rows) -> bool:
    """Whether each process group's sequence numbers only increase in the rank's record order
    (they repeat for coalesced ops, and a job could write anything)."""
    last: Dict[Any, int] = {}
    for row in rows:
        if sequence_number(row) <= last.get(row["pg_id"], -1):
            return False
        last[row["pg_id"]] = sequence_number(row)
    return True


def _signature(row: CollectivesRow, with_tensors: bool) -> Tuple[str, ...]:
    tensors = ("input_sizes", "input_dtypes", "output_sizes", "output_dtypes") if with_tensors else ()
    return (str(row.get("op")), *(json.dumps(decoded(row.get(name))) for name in tensors))


def _calls(rows_at: Dict[int, CollectivesRow]) -> List[Call]:
    groups: Dict[Tuple[str, ...], List[int]] = {}
    for rank, row in sorted(rows_at.items()):
        groups.setdefault(_signature(row, True), []).append(rank)
    calls = []
    for ranks in groups.values():
        row = rows_at[ranks[0]]
        calls.append(
            Call(ranks, str(row.get("op")), decoded(row.get("input_sizes")), decoded(row.get("input_dtypes")),
                 decoded(row.get("output_sizes")), decoded(row.get("output_dtypes")))
        )  # fmt: skip
    return sorted(calls, key=lambda call: (-len(call.ranks), call.ranks))


def _kind(rows: Rows) -> Optional[str]:
    if len({row.get("op") for row in rows}) > 1:
        return "op"
    if str(rows[0].get("op")) not in _SAME_TENSORS:
        return None
    if len({_signature(row, True)[1::2] for row in rows}) > 1:
        return "sizes"
    if len({_signature(row, True)[2::2] for row in rows}) > 1:
        return "dtypes"
    return None


def _at(by_rank: Dict[int, Rows]) -> Dict[Tuple[Any, int], Dict[int, CollectivesRow]]:
    """(process group, sequence number) -> rank -> its row."""
    at: Dict[Tuple[Any, int], Dict[int, CollectivesRow]] = {}
    for rank, rows in by_rank.items():
        for row in rows:
            at.setdefault((row["pg_id"], sequence_number(row)), {})[rank] = row
    return at


def compared(by_rank: Dict[int, Rows]) -> List[Mismatch]:
    """Ours: op, then sizes, then dtypes compared at each (process group, sequence number)."""
    found = []
    for (pg_id, seq), rows_at in sorted(_at(_comparable(by_rank)).items(), key=lambda item: str(item[0])):
        kind = _kind(list(rows_at.values())) if len(rows_at) > 1 else None
        if kind is None:
            continue
        calls = _calls(rows_at)
        described = "; ".join(f"{ranks_text(call.ranks)} {call_text(call, kind)}" for call in calls)
        desc = str(next(iter(rows_at.values())).get("pg_desc") or "")
        found.append(Mismatch(pg_id, desc, seq, kind, calls, f"{kind} differ: {described}", "probing"))
    return found


def call_text(call: Call, kind: str) -> str:
    if kind == "op":
        return call.op
    if kind == "sizes":
        return f"{call.op} of sizes {json.dumps(call.input_sizes)}"
    return f"{call.op} of dtypes {json.dumps(call.input_dtypes)}"


def _entry(row: CollectivesRow, index: int) -> Dict[str, Any]:
    """A row as the analyzer's dump entry (torch's _dump_fr_trace format)."""
    op = str(row.get("op"))
    backend = str(row.get("backend") or "nccl")
    created = row.get("time_created")
    return {
        "record_id": index,
        "pg_id": row["pg_id"],
        "process_group": [str(row["pg_id"]), str(row.get("pg_desc") or "undefined")],
        "collective_seq_id": row["seq"],
        "p2p_seq_id": row.get("p2p_seq") or 0,
        "op_id": row["seq"],
        "is_p2p": False,
        # The analyzer parses "backend:op" and knows a fixed list of backends and ops.
        "profiling_name": f"{backend}:{op}",
        "time_created_ns": int(created * 1e9) if isinstance(created, (int, float)) else 0,
        "input_sizes": decoded(row.get("input_sizes")) or [],
        "input_dtypes": decoded(row.get("input_dtypes")) or [],
        "output_sizes": decoded(row.get("output_sizes")) or [],
        "output_dtypes": decoded(row.get("output_dtypes")) or [],
        "state": "scheduled",  # live ranks differ in state by design: the module docstring says why
        "frames": [],
    }


def _details(by_rank: Dict[int, Rows]) -> Dict[str, Dict[str, Any]]:
    details = {}
    for rank, rows in by_rank.items():
        config = {
            str(row["pg_id"]): {
                "name": str(row["pg_id"]),
                "desc": str(row.get("pg_desc") or "undefined"),
                "ranks": json.dumps(decoded(row.get("pg_ranks")) or sorted(by_rank)),
            }
            for row in rows
        }
        entries = [_entry(row, index) for index, row in enumerate(rows)]
        details[f"rank{rank}"] = {
            "rank": rank, "entries": entries, "version": FLIGHT_RECORDER_VERSION,
            "pg_config": config, "host_name": f"rank{rank}",
        }  # fmt: skip
    return details


def flight_recorder_analyzer() -> Optional[Any]:
    """torch's build_db when torch is importable here (torch's import: 2.5 s of CPU on the 2-core
    machine of docs/scale.md, 1-1.5 s on others; the analyzer adds ~3 ms), else None. Its
    import-time warning (no `tabulate`) goes to its own logger, silenced; the process's streams are
    left alone."""
    recorder = logging.getLogger("Flight Recorder")
    disabled, recorder.disabled = recorder.disabled, True
    try:
        builder = importlib.import_module("torch.distributed.flight_recorder.components.builder")
        return builder.build_db
    except Exception:  # torch absent, or built without torch.distributed
        return None
    finally:
        recorder.disabled = disabled


def by_flight_recorder(by_rank: Dict[int, Rows], build_db: Any) -> List[Mismatch]:
    """torch's analyzer over the rows; raises what it raises (the caller falls back to ours)."""
    comparable = _comparable(by_rank)
    total = sum(len(rows) for rows in comparable.values())
    options = argparse.Namespace(
        verbose=False, just_print_entries=False, allow_incomplete_ranks=True, mismatch_cap=total + 1,
        selected_ranks=None, pg_filters=None, print_stack_trace=False,
    )  # fmt: skip
    recorder = logging.getLogger("Flight Recorder")
    disabled, recorder.disabled = recorder.disabled, True
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            database = build_db(_details(comparable), options, FLIGHT_RECORDER_VERSION)
    except SystemExit as exited:  # it exits where it means to stop a command line
        raise RuntimeError(f"the Flight Recorder analyzer exited ({exited.code})") from exited
    finally:
        recorder.disabled = disabled
    at = _at(comparable)
    pg_ids = {str(pg_id): pg_id for pg_id, _ in at}
    found: Dict[Tuple[Any, int], Mismatch] = {}
    for collective in database.collectives:
        culprits = collective.mismatch_collectives or {}
        errors = [culprit.type_of_mismatch for culprit in culprits.values() if culprit.type_of_mismatch]
        kinds = [_KINDS[error.state.name] for error in errors if error.state.name in _KINDS]
        pg_id = pg_ids.get(str(collective.group_id), collective.group_id)
        key = (pg_id, collective.collective_seq_id)
        if collective.pass_check or not kinds or key in found or key not in at:
            continue
        detail = "; ".join(str(error) for error in errors if error.state.name in _KINDS)
        desc = str(next(iter(at[key].values())).get("pg_desc") or "")
        found[key] = Mismatch(pg_id, desc, key[1], kinds[0], _calls(at[key]), detail, "flight_recorder")
    return [found[key] for key in sorted(found, key=str)]


def _compared_whole(comparable: Dict[int, Rows]) -> bool:
    """Whether ours compares every call of `comparable` (_comparable's) on all that torch's
    analyzer would (op, sizes, dtypes): each is an op whose tensors agree on every rank."""
    return all(str(row.get("op")) in _SAME_TENSORS for rows in comparable.values() for row in rows)


def mismatches(
    by_rank: Dict[int, Rows], load_analyzer: Callable[[], Optional[Any]]
) -> Tuple[List[Mismatch], str]:
    """Mismatched collectives among `by_rank` (each rank's python.collectives rows), and which
    check found them, with why ours did where it did.

    torch's analyzer (the `build_db` that `load_analyzer`, flight_recorder_analyzer, gives) decides
    wherever there is something to decide: where ours found a difference, or compared the op alone
    (gather, scatter, all_to_all). Where ours found every rank's calls the same, all of ops whose
    tensors must agree, the analyzer would compare the same fields and find them the same: it is not
    loaded (torch's import, 2.5 s of CPU on a 2-core machine, beside the job it looks at)."""
    collectives = {rank: _collective_rows(rows) for rank, rows in by_rank.items()}
    collectives = {rank: rows for rank, rows in collectives.items() if rows}
    if len(collectives) < 2:
        return [], "no two ranks gave collectives to compare"
    comparable = _comparable(collectives)
    if not all(_in_order(rows) for rows in comparable.values()):
        # Seen: the analyzer looping for minutes over such input, taking gigabytes.
        return compared(collectives), "compared by probing (sequence numbers repeat or go back)"
    ours = compared(collectives)
    if not ours and _compared_whole(comparable):
        return [], SAME_CALLS
    build_db = load_analyzer()
    if build_db is None:
        return ours, "compared by probing (torch is not importable in this process)"
    try:
        return by_flight_recorder(collectives, build_db), "checked by torch's Flight Recorder analyzer"
    except Exception as error:  # its own assertions on data it does not expect
        why = f"{type(error).__name__}: {error}".strip()
        return ours, f"compared by probing (the Flight Recorder analyzer failed: {why})"
