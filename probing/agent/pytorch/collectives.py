"""python.collectives and python.process_groups: the collectives of this rank, from the job's own
PyTorch Flight Recorder, or from the agent's light record where the job has none.

The Flight Recorder (torch 2.13 records gloo as well as NCCL, in a ring of 2000 entries by
default, TORCH_FR_BUFFER_SIZE) is read with `_dump_fr_trace`, which copies the entries' metadata
under the recorder's own mutex: safe from the agent's thread, no tensor touched. Its pickle is
made by torch in this process and loaded here, by an unpickler that admits no class; the CLI
never sees it, only the rows. The JSON dump holds the same, at six times the cost. Both hold a
broken pg_config in 2.13 with gloo (every group under the key '', name and description empty),
so the groups (ranks, description, backend) come from torch.distributed's own registry
(`distributed_c10d._world`); FR's pg_status gives each group's progress.

Where the dump holds nothing (no Flight Recorder in this torch, or TORCH_FR_BUFFER_SIZE=0) the
agent records the calls itself (collective_recorder.py), from the first time these tables are
asked for. Never imports torch: with no initialised torch.distributed in the job both tables
are empty, with a note.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple

from ..lifecycle import on_fork_in_child, on_stop
from . import collective_recorder
from .collective_recorder import Call

# Rows of python.collectives at most: the newest are kept, and the query says so.
MAX_ROWS = 10000
# The Flight Recorder's dump functions, newest name first; the pickled ones first: they cost a
# sixth of the JSON ones (2000 entries: 50 ms and 3.6 ms to load, against 120 ms and 230 ms,
# all of it holding the GIL, on a loaded 2-core machine).
DUMP_FUNCTIONS = ("_dump_fr_trace", "_dump_nccl_trace", "_dump_fr_trace_json", "_dump_nccl_trace_json")
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
    it: a dump of a full ring holds the job's GIL for 15-90 ms (2000 entries, on a loaded 2-core
    machine), and a fan-out may ask for both tables at once."""
    global _last_dump
    with _dump_lock:
        if _last_dump is not None and time.monotonic() - _last_dump[0] < DUMP_FRESH_S:
            if _last_dump[1] or not with_entries:
                return _last_dump[2]
        found = None if _switched_off() else _read_flight_recorder(with_entries)
        _last_dump = (time.monotonic(), with_entries, found)
        on_stop(_forget)  # registering again changes nothing
        on_fork_in_child(_new_lock_after_fork)
        return found


def _forget() -> None:
    """Detach: the last dump (up to a ring of entries) is not kept alive in the job."""
    global _last_dump
    _last_dump = None


def _new_lock_after_fork() -> None:
    global _dump_lock
    _dump_lock = threading.Lock()


DUMP_FRESH_S = 0.5
# A job that uses torch.compile: Dynamo knows torch.distributed's functions by identity (it turns
# them into traceable collectives), so wrappers of ours would make it recompile, or break a
# graph, or fail under fullgraph=True. Such a job is not recorded.
COMPILER = "torch._dynamo"
COMPILED = (
    "{table}: the job's torch has no Flight Recorder on, and probing does not record torch.distributed's "
    "calls itself in a job that uses torch.compile (its wrappers would change what Dynamo compiles)"
)
_dump_lock = threading.Lock()
_last_dump: Optional[Tuple[float, bool, Optional[Dict[str, Any]]]] = None


class _PlainUnpickler(pickle.Unpickler):
    """The dump is dicts, lists, strings and numbers: no class may be named in it."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a Flight Recorder dump names {module}.{name}")


def _read_flight_recorder(with_entries: bool) -> Optional[Dict[str, Any]]:
    torch = sys.modules.get("torch")
    bindings = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    for name in DUMP_FUNCTIONS:
        dump = getattr(bindings, name, None)
        if dump is None:
            continue
        try:
            if name.endswith("_json"):
                found = json.loads(dump(includeCollectives=with_entries, onlyActive=False))
            else:  # made by torch in this process; read here, never by the CLI
                raw = dump(includeCollectives=with_entries, includeStackTraces=False, onlyActive=False)
                found = _PlainUnpickler(io.BytesIO(raw)).load()
        except Exception:  # noqa: BLE001 - an older signature, or no recorder built in
            continue
        # Switched off, the recorder dumps no entries and knows no group (not even pg_config,
        # which a live recorder fills as groups are made, before their first collective).
        if isinstance(found, dict) and (
            found.get("entries") or found.get("pg_status") or found.get("pg_config")
        ):
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
            ranks = json.dumps([rank for rank, _ in sorted(mapping.items(), key=lambda pair: pair[1])])
        backend = backends.get(group)
        groups[str(name)] = Group(
            str(name), _text(getattr(group, "group_desc", None)), ranks, _number(group.size),
            _text(backend[0]) if isinstance(backend, tuple) and backend else None,
            _number(getattr(group, "_get_sequence_number_for_group", None)),
        )  # fmt: skip
    return groups


def _number(read: Any) -> Optional[int]:
    try:
        return int(read())
    except Exception:  # noqa: BLE001 - a backend without it, or a group torn down
        return None


def _text(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def _seconds(nanoseconds: Any) -> Optional[float]:
    return nanoseconds / 1e9 if isinstance(nanoseconds, (int, float)) and nanoseconds > 0 else None


def _sequence(value: Any) -> Optional[int]:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def _state(entry: Dict[str, Any]) -> str:
    """gloo leaves `state` at 'scheduled' for good and marks the end with `retired`."""
    if (
        entry.get("retired")
        or entry.get("state") == "completed"
        or _seconds(entry.get("time_discovered_completed_ns"))
    ):
        return "completed"
    if entry.get("state") == "started" or _seconds(entry.get("time_discovered_started_ns")):
        return "started"
    return str(entry.get("state") or "scheduled")


def _waited(created: Optional[float], completed: Optional[float], state: str, now: float) -> Optional[float]:
    if created is None:
        return None
    if completed is not None:
        return completed - created
    return None if state in ("completed", "failed") else now - created


def _cut(rows: Rows, notes: List[str]) -> Rows:
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
        return _cut(_flight_recorder_rows(job.rank, dump, groups), notes), notes
    if COMPILER in sys.modules:
        return [], [COMPILED.format(table="python.collectives")]
    recorder = collective_recorder.recorder(job.c10d, job.module)
    notes.append(_recording_note("python.collectives", recorder))
    calls = recorder.recorded_calls() + recorder.waiting_on_stacks(own_threads)
    return _cut(_recorded_rows(job.rank, calls, groups), notes), notes


def _flight_recorder_rows(rank: Optional[int], dump: Dict[str, Any], groups: Dict[str, Group]) -> Rows:
    now = time.time()
    rows = []
    for entry in dump.get("entries") or ():
        process_group = entry.get("process_group") or (entry.get("pg_id"), None)
        pg_id = _text(process_group[0])
        group = groups.get(pg_id or "")
        profiling_name = _text(entry.get("profiling_name")) or ""
        backend, _, op = profiling_name.rpartition(":")
        state = _state(entry)
        created = _seconds(entry.get("time_created_ns"))
        completed = _seconds(entry.get("time_discovered_completed_ns"))
        timeout_ms = entry.get("timeout_ms")
        rows.append((
            rank, pg_id, _text(process_group[1]) if len(process_group) > 1 else None,
            group.ranks if group else None,
            _sequence(entry.get("collective_seq_id")), _sequence(entry.get("p2p_seq_id")),
            bool(entry.get("is_p2p")), op or None, backend or (group.backend if group else None),
            profiling_name or None,
            entry.get("input_sizes"), entry.get("input_dtypes"),
            entry.get("output_sizes"), entry.get("output_dtypes"),
            state, created, _seconds(entry.get("time_discovered_started_ns")), completed,
            _waited(created, completed, state, now),
            timeout_ms / 1000.0 if isinstance(timeout_ms, (int, float)) else None,
            _sequence(entry.get("record_id")), _text(entry.get("thread_name")), "flight_recorder",
        ))  # fmt: skip
    return rows


def _recorded_rows(rank: Optional[int], calls: List[Call], groups: Dict[str, Group]) -> Rows:
    now = time.time()
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
    since = time.strftime("%H:%M:%S UTC", time.gmtime(recorder.started_at or time.time()))
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
                    _sequence(status.get("last_enqueued_collective")),
                    _sequence(status.get("last_started_collective")),
                    _sequence(status.get("last_completed_collective")),
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
        if not isinstance(entry, dict):
            continue
        seq = _sequence(entry.get("collective_seq_id"))
        if seq is None or entry.get("is_p2p") or _state(entry) != "completed":
            continue
        pg_id = _text((entry.get("process_group") or (entry.get("pg_id"),))[0])
        completed.setdefault(pg_id or "", set()).add(seq)
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
    return (int(pg_id), "") if pg_id.isdigit() else (sys.maxsize, pg_id)
