"""python.collectives and python.process_groups: the collectives of this rank, from the job's own
PyTorch Flight Recorder, or from the agent's light record where the job has none.

The Flight Recorder (torch 2.13 records gloo as well as NCCL, in a ring of 2000 entries by
default, TORCH_FR_BUFFER_SIZE) is read by flight_recorder.py: torch's dump copies the entries'
metadata under the recorder's own mutex (safe from the agent's thread, no tensor touched), made
outside the GIL where it can be, and read one entry at a time. It is made by torch in this
process and read here; the CLI never sees it, only the rows. It holds a
broken pg_config in 2.13 with gloo (every group under the key '', name and description empty),
so the groups (ranks, description, backend) come from torch.distributed's own registry
(`distributed_c10d._world`); FR's pg_status gives each group's progress.

Where the dump holds nothing (no Flight Recorder in this torch, or TORCH_FR_BUFFER_SIZE=0) the
agent records the calls itself (collective_recorder.py), from the first time these tables are
asked for. Never imports torch: with no initialised torch.distributed in the job both tables
are empty, with a note.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple

from ...originals import allocate_lock, json_dumps, monotonic, wall_time
from ..imported import imported
from ..lifecycle import on_fork_in_child, on_stop
from ..memory.objects import release
from ..pacing import Pacer
from . import collective_recorder, flight_recorder
from .collective_recorder import Call
from .flight_recorder import FREE_ENTRY_S, IS_P2P, PG_ID, SEQ, STATE, Entry, sequence, text

# Rows of python.collectives at most: the newest are kept, and the query says so.
MAX_ROWS = 10000
NOT_DISTRIBUTED = "{table} is empty: this process has not initialised torch.distributed"

Rows = List[Tuple[Any, ...]]


class Group(NamedTuple):
    pg_id: str
    desc: Optional[str]
    ranks: Optional[str]  # JSON list of global ranks, in group-rank order
    size: Optional[int]
    backend: Optional[str]
    operations: Optional[int]  # the group's own count of its operations (send/recv included)


class Distributed(NamedTuple):
    """The job's torch.distributed, when it is initialised."""

    c10d: Any
    module: Any
    rank: Optional[int]


def distributed() -> Optional[Distributed]:
    """The job's torch.distributed if it imported and initialised it; never imports it."""
    module = sys.modules.get("torch.distributed")
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if module is None or c10d is None:
        return None
    try:
        if not module.is_available() or not module.is_initialized():
            return None
        rank: Optional[int] = int(module.get_rank())
    except Exception:  # noqa: BLE001 - a torch half torn down at exit
        return None
    return Distributed(c10d, module, rank)


def flight_recorder_dump(with_entries: bool = True) -> Optional[Dict[str, Any]]:
    """The Flight Recorder's dump, or None where this torch has none or it records nothing.
    Without entries it holds only the groups' progress, and costs nothing to speak of.

    A dump made less than DUMP_FRESH_S ago is reused, and callers arriving during one wait for
    it: a dump of a full ring takes 30-65 ms (2000 entries, on a loaded 2-core machine; outside
    the GIL where flight_recorder.py can, else holding it), and a fan-out may ask for both tables
    at once."""
    global _last_dump
    with _dump_lock:
        if _last_dump is not None and monotonic() - _last_dump[0] < DUMP_FRESH_S:
            if _last_dump[1] or not with_entries:
                return _last_dump[2]
        previous, _last_dump = _last_dump, None
        if previous is not None and previous[2] is not None:  # a ring of entries: freed in slices
            release(previous[2].get("entries") or [], Pacer(), FREE_ENTRY_S)
        found = None if _switched_off() else _read_flight_recorder(with_entries)
        _last_dump = (monotonic(), with_entries, found)
        on_stop(_forget)  # registering again changes nothing
        on_fork_in_child(_new_lock_after_fork)
        return found


def _forget() -> None:
    """Detach: the last dump (up to a ring of entries) is not kept alive in the job."""
    global _last_dump
    _last_dump = None


def _new_lock_after_fork() -> None:
    global _dump_lock
    _dump_lock = allocate_lock()


DUMP_FRESH_S = 0.5
# A job that uses torch.compile: Dynamo knows torch.distributed's functions by identity (it turns
# them into traceable collectives), so wrappers of ours would make it recompile, or break a
# graph, or fail under fullgraph=True. Such a job is not recorded.
COMPILER = "torch._dynamo"
COMPILED = (
    "{table}: the job's torch has no Flight Recorder on, and probing does not record torch.distributed's "
    "calls itself in a job that uses torch.compile (its wrappers would change what Dynamo compiles)"
)
_dump_lock = allocate_lock()
_last_dump: Optional[Tuple[float, bool, Optional[Dict[str, Any]]]] = None


def _read_flight_recorder(with_entries: bool) -> Optional[Dict[str, Any]]:
    torch = imported("torch")
    bindings = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    found = flight_recorder.read(bindings, with_entries)
    # Switched off, the recorder dumps no entries and knows no group (not even pg_config,
    # which a live recorder fills as groups are made, before their first collective).
    if found is not None and (found.get("entries") or found.get("pg_status") or found.get("pg_config")):
        return found
    return None


def _switched_off() -> bool:
    """The job's environment turns the recorder off (a ring of 0 entries): what the dump says
    is then not trusted to be on, whatever a backend fills in."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(name)
        if value is not None:
            return value.strip() == "0"
    return False


def known_groups(c10d: Any) -> Dict[str, Group]:
    """Every process group torch.distributed knows, by its name (FR's pg_id)."""
    world = c10d._world
    names = dict(world.pg_names)  # copies: the job may make a group meanwhile
    group_ranks = dict(world.pg_group_ranks)
    backends = dict(world.pg_map)
    groups = {}
    for group, name in names.items():
        mapping = group_ranks.get(group)
        ranks = None
        if isinstance(mapping, dict):
            ranks = json_dumps([rank for rank, _ in sorted(mapping.items(), key=lambda pair: pair[1])])
        backend = backends.get(group)
        groups[str(name)] = Group(
            str(name), text(getattr(group, "group_desc", None)), ranks, _number(group.size),
            text(backend[0]) if isinstance(backend, tuple) and backend else None,
            _number(getattr(group, "_get_sequence_number_for_group", None)),
        )  # fmt: skip
    return groups


def _number(read: Any) -> Optional[int]:
    try:
        return int(read())
    except Exception:  # noqa: BLE001 - a backend without it, or a group torn down
        return None


def _waited(created: Optional[float], completed: Optional[float], state: str, now: float) -> Optional[float]:
    if created is None:
        return None
    if completed is not None:
        return completed - created
    return None if state in ("completed", "failed") else now - created


def _cut(rows: List[Any], notes: List[str]) -> List[Any]:
    if len(rows) > MAX_ROWS:
        notes.append(f"python.collectives: the newest {MAX_ROWS} of {len(rows)} collectives are listed")
        return rows[-MAX_ROWS:]
    return rows


def collective_rows(own_threads: Any) -> Tuple[Rows, List[str]]:
    job = distributed()
    if job is None:
        return [], [NOT_DISTRIBUTED.format(table="python.collectives")]
    dump = flight_recorder_dump()
    groups = known_groups(job.c10d)
    notes: List[str] = []
    if dump is not None:
        entries = [entry for entry in dump.get("entries") or () if entry is not None]
        return _flight_recorder_rows(job.rank, _cut(entries, notes), groups), notes
    if COMPILER in sys.modules:
        return [], [COMPILED.format(table="python.collectives")]
    recorder = collective_recorder.recorder(job.c10d, job.module)
    notes.append(_recording_note("python.collectives", recorder))
    calls = recorder.recorded_calls() + recorder.waiting_on_stacks(own_threads)
    return _cut(_recorded_rows(job.rank, calls, groups), notes), notes


def _flight_recorder_rows(rank: Optional[int], entries: List[Entry], groups: Dict[str, Group]) -> Rows:
    now = wall_time()
    rows = []
    pacer = Pacer()
    for entry in entries:
        pacer.pause_if_due()
        (pg_id, pg_desc, seq, p2p_seq, is_p2p, op, backend, profiling_name, input_sizes, input_dtypes,
         output_sizes, output_dtypes, state, created, started, completed, timeout_s, record_id,
         thread_name) = entry  # fmt: skip
        group = groups.get(pg_id or "")
        rows.append((
            rank, pg_id, pg_desc, group.ranks if group else None, seq, p2p_seq, is_p2p, op,
            backend or (group.backend if group else None), profiling_name,
            input_sizes, input_dtypes, output_sizes, output_dtypes,
            state, created, started, completed, _waited(created, completed, state, now), timeout_s,
            record_id, thread_name, "flight_recorder",
        ))  # fmt: skip
    return rows


def _recorded_rows(rank: Optional[int], calls: List[Call], groups: Dict[str, Group]) -> Rows:
    now = wall_time()
    rows = []
    for call in calls:
        group = groups.get(call.pg_id or "")
        backend = group.backend if group else None
        rows.append((
            rank, call.pg_id, call.pg_desc if call.pg_desc is not None else (group.desc if group else None),
            group.ranks if group else None, call.seq, None, call.is_p2p, call.op, backend,
            f"{backend}:{call.op}" if backend else call.op,
            call.sizes(call.inputs), call.dtypes(call.inputs),
            call.sizes(call.outputs), call.dtypes(call.outputs),
            call.state, call.created, call.created, call.completed,
            _waited(call.created, call.completed, call.state, now), None,
            call.record_id if call.record_id >= 0 else None, call.thread_name, "probing",
        ))  # fmt: skip
    return rows


def _recording_note(table: str, recorder: collective_recorder.CollectiveRecorder) -> str:
    since = time.strftime("%H:%M:%S UTC", time.gmtime(recorder.started_at or wall_time()))
    return (
        f"{table}: the job's torch has no Flight Recorder on (TORCH_FR_BUFFER_SIZE=0?); "
        f"probing records torch.distributed's calls itself since {since}"
    )


def process_group_rows() -> Tuple[Rows, List[str]]:
    job = distributed()
    if job is None:
        return [], [NOT_DISTRIBUTED.format(table="python.process_groups")]
    groups = known_groups(job.c10d)
    dump = flight_recorder_dump(with_entries=False)
    progress: Dict[str, List[Optional[int]]] = {}
    notes: List[str] = []
    if dump is not None:
        source = "flight_recorder"
        for pg_id, status in (dump.get("pg_status") or {}).items():
            if isinstance(status, dict):
                progress[str(pg_id)] = [
                    sequence(status.get("last_enqueued_collective")),
                    sequence(status.get("last_started_collective")),
                    sequence(status.get("last_completed_collective")),
                ]
        lagging = {
            pg_id: last for pg_id, last in progress.items()
            if (last[2] or 0) < (last[0] or 0) and pg_id in groups and "gloo" in (groups[pg_id].backend or "")
        }  # fmt: skip
        if lagging:
            _raise_to_completed_entries(lagging, (flight_recorder_dump() or {}).get("entries") or ())
    elif COMPILER in sys.modules:
        source = "probing"
        notes.append(COMPILED.format(table="python.process_groups"))
        for pg_id, known in groups.items():
            progress[pg_id] = [known.operations, None, None]
    else:
        source = "probing"
        recorder = collective_recorder.recorder(job.c10d, job.module)
        notes.append(_recording_note("python.process_groups", recorder))
        for pg_id, (enqueued, completed) in list(recorder.last.items()):  # job threads add groups
            progress[pg_id] = [enqueued, None, completed]
        # The group's own count knows what it enqueued before the recording began.
        for pg_id, known in groups.items():
            if known.operations:
                last = progress.setdefault(pg_id, [None, None, None])
                last[0] = max(last[0] or 0, known.operations)
    rows = []
    for pg_id in sorted(set(groups) | set(progress), key=_group_order):
        group = groups.get(pg_id)
        enqueued, started, completed = progress.get(pg_id, [None, None, None])
        rows.append((
            job.rank, pg_id, group.desc if group else None, group.ranks if group else None,
            group.size if group else None, group.backend if group else None,
            enqueued, started, completed, source,
        ))  # fmt: skip
    return rows, notes


def _raise_to_completed_entries(progress: Dict[str, List[Optional[int]]], entries: Any) -> None:
    """torch's gloo sets a group's last completed number from whichever worker thread finishes
    last, so under load it can fall back below one already completed (9 after 10). It is raised
    over the entries completed right after it, one by one: never past one still running (gloo
    may finish a later collective first), so it never says more than is known."""
    completed: Dict[str, Set[int]] = {}
    for entry in entries:
        if entry is None or entry[SEQ] is None or entry[IS_P2P] or entry[STATE] != "completed":
            continue
        completed.setdefault(entry[PG_ID] or "", set()).add(entry[SEQ])
    for pg_id, last in progress.items():
        done = completed.get(pg_id, set())
        highest = last[2] or 0
        while highest + 1 in done:
            highest += 1
        last[2] = highest if highest or last[2] is not None else None
        if last[1] is not None:
            last[1] = max(last[1], highest)


def _group_order(pg_id: str) -> Tuple[int, str]:
    """Numbered groups in their order ("2" before "10"), then named ones."""
    return (int(pg_id), "") if pg_id.isdecimal() else (sys.maxsize, pg_id)
