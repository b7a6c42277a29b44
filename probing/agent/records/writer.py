"""Writing one record: the header of the contract (why, when, who) and every table the agent
can build cheaply at that moment, each through the builder that serves it live (tables.py).

The job is held while a record is written (the dying thread writes it), so everything here is
bounded: the rings are already capped, the tables together stay under PROBING_RECORD_MAX_MB
(the oldest rows of a ring are cut first, and the header says so), and tables that would walk
the heap (python.gc, python.tensors) are left out. Tables that read tensor data (gradient norms,
optimizer values) are built only in the training thread itself, never from the agent's.
"""

from __future__ import annotations

import copy
import os
import sys
from types import FrameType, TracebackType
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ...originals import allocate_lock, get_ident, monotonic, wall_time
from ...protocol.records import write_record
from ...schema.rows import backtrace_values
from ...schema.tables import BACKTRACE
from ..reprs import BoundedRepr
from ..ring import Ring
from ..stacks import frame_locals_json, thread_fields, thread_stacks
from ..tables import BUILDERS, new_builder
from . import retention, settings
from .header import header
from .trigger import Trigger

# Locals are taken for this many innermost frames of each thread: where it is stuck or failed.
LOCALS_FRAMES = 3
# The scan budget of a record written as the job ends (an uncaught exception in its main thread,
# an exit): its bound on one uncut C call is a hundredth of it (pacing.stall_bound).
ENDING_SCAN_BUDGET_S = 20.0
REPR_LIMIT = 200
# Tables every record holds, in this order; the torch ones only once torch is imported.
BASE_TABLES = (
    "python.backtrace", "python.threads", "process.info", "process.memory", "python.gc_generations",
)  # fmt: skip
TORCH_TABLES = ("python.torch_trace", "python.nan_events", "torch.cuda_memory")
# Read gradients or optimizer values: built only by the training thread (see module doc).
TRAINING_THREAD_TABLES = ("python.modules", "python.optimizers")
DISTRIBUTED_TABLES = ("python.collectives", "python.process_groups")
_HERE = os.path.dirname(os.path.abspath(__file__))


class RecordFailed(Exception):
    """No record was written; the message says why (a refused directory, a full disk)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def _ident_of(thread: Any) -> Optional[int]:
    ident = thread_fields(thread).get("_ident")
    return ident if type(ident) is int else None


def _frames_of(
    thread_ident: int, trigger: Trigger, current: Optional[FrameType]
) -> List[Tuple[FrameType, int]]:
    """(frame, line) innermost first: the exception's frames for the thread it ended, the
    interrupted frame for the signalled thread, the frames before probing's own otherwise."""
    error = trigger.error
    if (
        error is not None and error.__traceback__ is not None
        and _ident_of(trigger.thread) == thread_ident
    ):  # fmt: skip
        tb: Optional[TracebackType] = error.__traceback__
        frames: List[Tuple[FrameType, int]] = []
        outer = tb.tb_frame.f_back if tb is not None else None
        while tb is not None:
            frames.append((tb.tb_frame, tb.tb_lineno))
            tb = tb.tb_next
        frames.reverse()
        while outer is not None:
            frames.append((outer, outer.f_lineno))
            outer = outer.f_back
        return frames
    frame = current
    if trigger.frame is not None and _ident_of(trigger.thread) == thread_ident:
        frame = trigger.frame  # the interrupted frame, not our handler waiting for the record
    elif thread_ident == get_ident():
        frame = trigger.frame if trigger.frame is not None else sys._getframe()
        while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _HERE:
            frame = frame.f_back
    found = []
    while frame is not None:
        found.append((frame, frame.f_lineno))
        frame = frame.f_back
    return found


def backtrace_table(own_threads: Set[int], trigger: Trigger) -> Any:
    """python.backtrace at the moment of the trigger, with locals of the innermost frames."""
    builder = new_builder(BACKTRACE)
    render = BoundedRepr(REPR_LIMIT).render
    locals_frames = LOCALS_FRAMES if trigger.locals else 0
    pid = os.getpid()
    if trigger.helper_thread:
        own_threads = own_threads | {get_ident()}
    for stack in thread_stacks(own_threads):
        frames = _frames_of(stack.ident, trigger, stack.frame)
        for depth, (frame, lineno) in enumerate(frames):
            code = frame.f_code
            try:
                local_values = frame_locals_json(frame, render) if depth < locals_frames else None
            except Exception as error:  # noqa: BLE001 - a local whose repr fails must not cost the record
                local_values = None
                builder.notes.append(f"python.backtrace: locals of {code.co_name}: {type(error).__name__}")
            builder.append(backtrace_values(
                pid=pid, thread_id=stack.ident, native_id=stack.native_id, thread_name=stack.name,
                is_main=stack.is_main, depth=depth, func=code.co_name, file=code.co_filename, lineno=lineno,
                frame_type="Python", locals=local_values, source="agent",
            ))  # fmt: skip
    return builder


def _chunk_bytes(chunks: Sequence[Any]) -> int:
    return sum(memoryview(chunk).nbytes for chunk in chunks)


def _newest_blocks(ring: Ring, blocks: int) -> Ring:
    """A view of `ring` holding only its newest `blocks` blocks: the one being filled (it
    holds the newest rows) and the newest frozen ones. It shares the ring's lock, words and
    block being filled, so the job's threads may go on appending meanwhile."""
    view = copy.copy(ring)
    with ring.lock:
        view.frozen = list(ring.frozen)[-(blocks - 1) :] if blocks > 1 else []
    return view


def _newest_rows(ring: Ring, rows: int) -> Ring:
    """A view of `ring` holding only the newest `rows` rows of its newest block."""
    view = copy.copy(ring)
    view.lock = allocate_lock()
    view.frozen = []
    block = type(ring.current)(ring.typecodes)
    with ring.lock:
        current = ring.current if ring.current.rows or not ring.frozen else ring.frozen[-1]
        end = current.rows
        start = max(0, end - rows)
        block.columns = [column[start:end] for column in current.columns]
        block.valid = [None if valid is None else valid[start:end] for valid in current.valid]
        block.rows = end - start
        view.words = list(ring.words)
    view.current = block
    return view


def _bounded(name: str, source: Any, budget: int, notes: List[str]) -> Optional[Tuple[Dict[str, Any], Any]]:
    """The table encoded within `budget` bytes: a ring cut to its newest blocks, a table that
    still does not fit left out; what was cut goes into `notes`."""
    descriptor, chunks = source.encode()
    size = _chunk_bytes(chunks)
    if size <= budget:
        return descriptor, chunks
    rows = descriptor.get("rows") or 0
    if isinstance(source, Ring) and rows:
        per_row = max(1.0, size / rows)
        # At least the block being filled: the newest rows, often far fewer than a block's.
        blocks = max(1, int(budget / per_row) // source.block_rows)
        # Then rows of the newest block, fewer each time (padding and dictionaries are not per row).
        newest = int(budget / per_row)
        views = [_newest_blocks(source, count) for count in range(blocks, 0, -1)]
        views += [_newest_rows(source, newest * 3**tries // 4**tries) for tries in range(6)]
        for view in views:
            descriptor, chunks = view.encode()
            if _chunk_bytes(chunks) <= budget and descriptor.get("rows"):
                kept = descriptor.get("rows") or 0
                notes.append(
                    f"{name}: cut to its newest {kept} of {rows} rows to stay under "
                    f"PROBING_RECORD_MAX_MB ({size} bytes whole)"
                )
                return descriptor, chunks
    notes.append(f"{name}: left out: {size} bytes, more than the {budget} left under PROBING_RECORD_MAX_MB")
    return None


def _table_names(trigger: Trigger) -> Tuple[List[str], List[str]]:
    """The tables to build, and notes on those left out."""
    names = list(BASE_TABLES)
    notes: List[str] = []
    if "torch" not in sys.modules:
        return names, notes
    names += TORCH_TABLES
    if trigger.training_thread and _step_gate_ready():
        names += TRAINING_THREAD_TABLES
    elif trigger.training_thread:
        notes.append(
            "python.modules, python.optimizers: left out (nothing had read them live yet: "
            "reading them first would put a step hook into the dying job)"
        )
    else:
        notes.append(
            "python.modules, python.optimizers: left out (they read gradients and optimizer values, "
            "which only the training thread may read, and it did not write this record)"
        )
    distributed = sys.modules.get("torch.distributed")
    try:
        if distributed is not None and distributed.is_available() and distributed.is_initialized():
            names += DISTRIBUTED_TABLES
    except Exception:  # noqa: BLE001, S110 - a half-imported torch.distributed: no such tables
        pass
    return names, notes


def _step_gate_ready() -> bool:
    # Reading modules' gradient norms goes through the step gate; once a live query has put it
    # in, reading here is at once and adds nothing to the job.
    safepoint = sys.modules.get(__package__.rsplit(".", 1)[0] + ".pytorch.safepoint")
    gate = getattr(safepoint, "_gate", None)
    return gate is not None and getattr(gate, "handle", None) is not None


Encoded = Tuple[Dict[str, Any], Any]


def build_tables(server: Any, trigger: Trigger, budget: int) -> Tuple[List[Encoded], List[str]]:
    names, notes = _table_names(trigger)
    own: Set[int] = set(server.own_threads) if server is not None else set()
    tables: List[Tuple[Dict[str, Any], Any]] = []
    params: Dict[str, Any] = {"step_wait_s": 0.0}
    if trigger.status is not None:
        # The job is ending: a stall no longer costs it a step, and a whole count of its objects
        # is worth one (up to 200 ms a generation of gc's objects instead of 10 ms).
        params["scan_budget_s"] = ENDING_SCAN_BUDGET_S
    for name in names:
        try:
            if name == BACKTRACE.name:
                source = backtrace_table(own, trigger)
            else:
                source = BUILDERS[name](server, params)
            encoded = _bounded(name, source, budget, notes)
        except Exception as error:  # noqa: BLE001 - one table failing must not cost the record
            notes.append(f"{name}: left out: {type(error).__name__}: {error}")
            continue
        if encoded is None:
            continue
        notes.extend(str(note) for note in encoded[0].get("notes", ()))
        budget -= _chunk_bytes(encoded[1])
        tables.append(encoded)
    return tables, notes


def write(server: Any, trigger: Trigger, extra_notes: Sequence[str] = ()) -> Dict[str, Any]:
    """Write one record now; its path, size, seconds, tables and notes. RecordFailed when none
    could be written (the message says why); never anything else."""
    started = monotonic()
    written_at = wall_time()
    try:
        directory = settings.prepare_dir(settings.record_dir())
    except settings.RecordDirRefused as error:
        raise RecordFailed(f"record directory refused: {error}", refused=True) from None
    try:
        tables, notes = build_tables(server, trigger, settings.max_bytes())
        document = header(trigger, list(extra_notes) + list(trigger.notes) + notes, written_at)
        document["tables"] = [descriptor.get("name") for descriptor, _ in tables]
        # The header goes first in the file: this is the time held until the write began.
        document["write_seconds"] = round(monotonic() - started, 6)
        path = settings.unique_path(directory, settings.record_name(os.getpid(), written_at))
        write_record(directory, os.path.basename(path), document, tables)
    except OSError as error:
        # A full disk (ENOSPC), a quota, a directory removed meanwhile: said as the system says it.
        raise RecordFailed(f"cannot write in {directory}: {error.strerror or error}") from None
    except Exception as error:  # noqa: BLE001 - anything else: no record, and why
        raise RecordFailed(f"{type(error).__name__}: {error}") from None
    retention.prune(directory, retention.retention(), written=path)
    return {
        "path": path,
        "bytes": os.path.getsize(path),
        "seconds": round(monotonic() - started, 6),
        "tables": document["tables"],
        "notes": document["notes"],
    }
