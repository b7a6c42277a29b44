"""Reading the job's PyTorch Flight Recorder with as little stall as torch allows.

torch's bindings build the dump (every entry's metadata, pickled) holding the GIL throughout:
30-65 ms for a full ring of 2000 gloo entries on a loaded 2-core machine, 3.7 s for 20 000,
every thread of the job held still meanwhile. That one call is not ours to slice, and it is
made only when a command asks for collectives. The C++ function underneath could be called
through ctypes with the GIL let go, but nothing catches a C++ exception there: one thrown by
the dump (nlohmann's strict UTF-8 check on a thread name the kernel cut mid-character, an
allocation refused) would end the job, which a stall never does. docs/decisions.md says so.

What follows the call is ours, and paced: the pickle is loaded by an unpickler that admits no
class (pure Python, pausing, past DECODE_AT_ONCE_BYTES), and each entry is made a flat tuple at
once (`Entry`): the dicts and lists of one entry die young. Decoding a whole ring into dicts
made ~8 containers an entry that all lived until the end: enough for gc to collect its oldest
generation (300 ms on a job that imported torch) in the middle.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Callable, Dict, Optional, Tuple

from ...originals import json_dumps
from ..memory.objects import release
from ..pacing import Pacer

DECODE_AT_ONCE_BYTES = 256 * 1024
# What freeing one `Entry` (a tuple, its strings and numbers) costs, about, on a loaded machine.
FREE_ENTRY_S = 2e-6

# An entry as python.collectives needs it: plain values only (sizes and dtypes as JSON text).
Entry = Tuple[Any, ...]
(PG_ID, PG_DESC, SEQ, P2P_SEQ, IS_P2P, OP, BACKEND, PROFILING_NAME, INPUT_SIZES, INPUT_DTYPES,
 OUTPUT_SIZES, OUTPUT_DTYPES, STATE, CREATED, STARTED, COMPLETED, TIMEOUT_S, RECORD_ID,
 THREAD_NAME) = range(19)  # fmt: skip


def text(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def seconds(nanoseconds: Any) -> Optional[float]:
    return nanoseconds / 1e9 if isinstance(nanoseconds, (int, float)) and nanoseconds > 0 else None


def sequence(value: Any) -> Optional[int]:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def state_of(entry: Dict[str, Any]) -> str:
    """gloo leaves `state` at 'scheduled' for good and marks the end with `retired`."""
    if (
        entry.get("retired")
        or entry.get("state") == "completed"
        or seconds(entry.get("time_discovered_completed_ns"))
    ):
        return "completed"
    if entry.get("state") == "started" or seconds(entry.get("time_discovered_started_ns")):
        return "started"
    return str(entry.get("state") or "scheduled")


def _json_text(value: Any) -> Optional[str]:
    return None if value is None else json_dumps(value)


def compact(entry: Any) -> Optional[Entry]:
    """One entry of the dump as an `Entry`; None for what is not an entry."""
    if not isinstance(entry, dict):
        return None
    process_group = entry.get("process_group") or (entry.get("pg_id"), None)
    profiling_name = text(entry.get("profiling_name")) or ""
    backend, _, op = profiling_name.rpartition(":")
    timeout_ms = entry.get("timeout_ms")
    return (
        text(process_group[0]), text(process_group[1]) if len(process_group) > 1 else None,
        sequence(entry.get("collective_seq_id")), sequence(entry.get("p2p_seq_id")),
        bool(entry.get("is_p2p")), op or None, backend or None, profiling_name or None,
        _json_text(entry.get("input_sizes")), _json_text(entry.get("input_dtypes")),
        _json_text(entry.get("output_sizes")), _json_text(entry.get("output_dtypes")),
        state_of(entry), seconds(entry.get("time_created_ns")),
        seconds(entry.get("time_discovered_started_ns")), seconds(entry.get("time_discovered_completed_ns")),
        timeout_ms / 1000.0 if isinstance(timeout_ms, (int, float)) else None,
        sequence(entry.get("record_id")), text(entry.get("thread_name")),
    )  # fmt: skip


# The recorders a torch may have: a CUDA build keeps NCCL's apart (events of CUDA) from the one
# of every other backend (gloo), and a job may use both (NCCL for its tensors, gloo for objects
# and barriers). An H200 run found the NCCL job's entries in the second alone: the first, read
# alone, gave an empty recorder, and python.collectives fell back to probing's own record.
DUMPS = ("_dump_fr_trace", "_dump_nccl_trace")
# What two dumps hold per process group, joined where the job has both recorders.
PER_GROUP_KEYS = ("pg_config", "pg_status")


def read(bindings: Any, with_entries: bool) -> Optional[Dict[str, Any]]:
    """The recorders' dump, their entries as `Entry` tuples, or None where none could be read
    (no recorder in this torch, an older signature). A torch with both recorders gives both's
    entries and groups; one that dumps the same recorder under both names, it once."""
    joined: Optional[Dict[str, Any]] = None
    for name in DUMPS:
        found = _dump(getattr(bindings, name, None), with_entries)
        if found is None:
            continue
        if joined is None:
            joined = found
        elif found["entries"] != joined["entries"] or any(
            found.get(key) != joined.get(key) for key in PER_GROUP_KEYS
        ):
            joined["entries"] = joined["entries"] + found["entries"]
            for key in PER_GROUP_KEYS:
                groups = found.get(key)
                if isinstance(groups, dict):
                    mine = joined.get(key)
                    joined[key] = dict(mine, **groups) if isinstance(mine, dict) else groups
    return joined


def _dump(dump: Any, with_entries: bool) -> Optional[Dict[str, Any]]:
    """One recorder's dump, decoded, its entries compacted; None where it cannot be read."""
    if dump is None:
        return None
    try:  # made by torch in this process; read here, never by the CLI
        found = decode(dump(includeCollectives=with_entries, includeStackTraces=False, onlyActive=False))
    except Exception:  # noqa: BLE001 - an older signature, or no recorder built in
        return None
    if not isinstance(found, dict):
        return None
    pacer = Pacer()
    whole = found.get("entries") or []
    found["entries"] = [_paced(compact, entry, pacer) for entry in whole]
    release(whole, pacer, FREE_ENTRY_S * 8)  # the dicts and lists of every entry
    return found


def _paced(make: Callable[[Any], Any], value: Any, pacer: Pacer) -> Any:
    pacer.pause_if_due()
    return make(value)


class _PlainUnpickler(pickle.Unpickler):
    """The dump is dicts, lists, strings and numbers: no class may be named in it."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a Flight Recorder dump names {module}.{name}")


_PythonUnpickler: Any = getattr(pickle, "_Unpickler", None)


def decode(raw: bytes) -> Any:
    """A pickled dump; a large one decoded in slices."""
    if len(raw) <= DECODE_AT_ONCE_BYTES or _PythonUnpickler is None:
        return _PlainUnpickler(io.BytesIO(raw)).load()
    return _SlicedUnpickler(io.BytesIO(raw)).load()


if _PythonUnpickler is not None:

    class _SlicedUnpickler(_PythonUnpickler):  # type: ignore[misc]
        """pickle's pure-Python unpickler, pausing for the job's threads between dicts."""

        dispatch = dict(_PythonUnpickler.dispatch)

        def __init__(self, file: Any) -> None:
            super().__init__(file)
            self.pacer = Pacer()

        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError(f"a Flight Recorder dump names {module}.{name}")

        def load_setitems(self) -> None:
            self.pacer.pause_if_due()
            _PythonUnpickler.load_setitems(self)

        dispatch[pickle.SETITEMS[0]] = load_setitems
