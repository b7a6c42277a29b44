"""memory --growth for tensors: the storages new at the window's end, by the line of the job that
made them, and what holds them.

tracemalloc cannot see tensor storage (torch's allocators do not go through Python's), but it
sees each tensor's Python object allocated, with its traceback. So at the window's end, while
tracemalloc still runs, every live tensor whose object it traced (one made in the window) lends
its storage the lines that made it (`made_in_window`). Once tracemalloc is stopped, the storages
the census then finds and the census at the window's start did not are the tensor growth
(`tensor_growth`): each by the lines that made its tensor (or by none: a tensor object older than
the window, or made before tracing began), and what holds it, from a bounded walk from the job's
variables (holders.py). Only metadata is read: addresses, offsets, shapes, strides, devices.

While tracemalloc runs, every allocation the agent makes is traced too (microseconds each, and
the job's allocations wait on the same lock), so the pass then allocates nothing per object it
looks at: the tensors are picked out of gc's lists by C iterators, and a lookup allocates only
for a tensor tracemalloc traced.
"""

from __future__ import annotations

import math
import sys
import tracemalloc
from itertools import compress
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...originals import perf_counter
from ..imported import imported
from ..pacing import Pacer
from .census import Census
from .cuda import MB
from .holders import Holders, find_holders
from .job_code import is_library, library_roots
from .objects import GENERATIONS, list_generation, release
from .storages import device_of, storage_extent

# Objects of one of gc's lists picked over in one C call (~20-50 ns each): well within a slice.
PASS_CHUNK = 20_000
# New storages whose holders are looked for, at most (the largest first).
NAMED_MAX = 20_000
HOLDERS_SHOWN = 3
_MANAGED_DICT = 1 << 4  # Py_TPFLAGS_MANAGED_DICT (3.11)
_GC = 1 << 14  # Py_TPFLAGS_HAVE_GC
# A tensor made in the window: (the tensor, tracemalloc's frames for its object, newest first).
Made = Tuple[Any, Any]
# A tensor -> tracemalloc's frames for its object (newest first), or None.
Lookup = Callable[[Any], Any]
# Where a storage's tensor was made: file and line, and the job's own line that led there.
Site = Tuple[Optional[str], Optional[int], Optional[str], Optional[int]]


_lookups: List[Optional[Lookup]] = []  # made once: ctypes' objects are no growth of the job's


def traceback_lookup() -> Optional[Lookup]:
    """obj -> tracemalloc's raw frames for its allocation (newest first), or None; None where
    the job has no torch, or tracemalloc cannot say. Asked for before a window's first census,
    so that what making it allocates is in both censuses.

    CPython 3.11's tracemalloc.get_object_traceback misses objects whose memory starts before
    their GC header (gh-101430, fixed in 3.12): those with a managed `__dict__`, torch's tensors
    among them. There the lookup is made by the address the allocation really starts at,
    through the C function tracemalloc's own lookup calls (PYFUNCTYPE: the GIL stays held).
    """
    if "torch" not in sys.modules:
        return None
    if not _lookups:
        _lookups.append(_made_lookup())
    return _lookups[0]


def _made_lookup() -> Optional[Lookup]:
    try:
        import _tracemalloc

        public: Lookup = _tracemalloc._get_object_traceback
    except (ImportError, AttributeError):
        return None
    if sys.version_info[:2] != (3, 11):
        return public
    try:
        import ctypes

        prototype = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_uint, ctypes.c_size_t)
        by_address = prototype(("_PyTraceMalloc_GetTraceback", ctypes.pythonapi))
        pointer = ctypes.sizeof(ctypes.c_void_p)
    except (ImportError, AttributeError, OSError):
        return None

    def lookup(obj: Any) -> Any:
        flags = type(obj).__flags__
        if not flags & _MANAGED_DICT:
            return public(obj)
        header = 2 * pointer + (2 * pointer if flags & _GC else 0)  # the dict pointers, PyGC_Head
        return by_address(0, id(obj) - header)

    return lookup


def catch_up(census: Census, kinds: Tuple[type, ...], bound_s: float, pacer: Pacer) -> None:
    """Add to `census.storages` those of the tensors in gc's young generations, just before
    tracing starts: a tensor made while the census ran (after it listed generation 0) would
    otherwise be new storage with no line. One made and promoted to the oldest generation while
    the census ran is still missed (its line is then unknown, and said so)."""
    if not kinds:
        return
    is_tensor = frozenset(kinds).__contains__
    for generation in range(GENERATIONS - 1):
        objects, _ = list_generation(generation, bound_s)
        if objects is None:
            continue
        for tensor in compress(objects, map(is_tensor, map(type, objects))):
            pacer.pause_if_due()
            extent = storage_extent(tensor)
            if extent is not None and census.storages.get(extent[0], -1) < extent[1]:
                census.storages[extent[0]] = extent[1]
        tensor = None
        release(objects, pacer)
        pacer.pause()


def made_in_window(
    kinds: Tuple[type, ...],
    lookup: Optional[Lookup],
    bound_s: float,
    budget_s: float,
    pacer: Pacer,
) -> Tuple[List[Made], List[str]]:
    """Every live tensor of `kinds` whose object tracemalloc traced (`lookup`: traceback_lookup's),
    with its frames; called while tracemalloc runs. And notes: what was not looked at."""
    if not kinds:
        return [], []
    if lookup is None or not tracemalloc.is_tracing():
        return [], [
            "tensor storage is not attributed to lines: tracemalloc cannot say here where objects were made"
        ]
    is_tensor = frozenset(kinds).__contains__
    deadline = perf_counter() + budget_s
    made: List[Made] = []
    notes: List[str] = []
    for generation in range(GENERATIONS):
        objects, skipped = list_generation(generation, bound_s)
        if objects is None:
            if skipped is not None:
                notes.append(f"tensor storage: lines unknown for the tensors in {skipped.describe()}")
            continue
        pacer.pause()
        for start in range(0, len(objects), PASS_CHUNK):
            part = objects[start : start + PASS_CHUNK]
            for tensor in compress(part, map(is_tensor, map(type, part))):
                frames = lookup(tensor)
                if frames is not None:
                    made.append((tensor, frames))
            tensor = None
            del part
            pacer.pause_if_due()
            if perf_counter() > deadline:
                notes.append(
                    f"tensor storage: the lines that made tensors were looked for for {budget_s:g} s only "
                    "(raise --scan-budget): the storages of the tensors not reached have no line"
                )
                release(objects, pacer)
                return made, notes
        release(objects, pacer)
    return made, notes


def origins(made: List[Made], pacer: Pacer) -> Dict[int, Any]:
    """storage key -> the frames of a tensor made in the window on that storage. The tensors are
    let go of here (in slices): none outlives the call."""
    found: Dict[int, Any] = {}
    for index, (tensor, frames) in enumerate(made):
        if not index & 255:
            pacer.pause_if_due()
        extent = storage_extent(tensor)
        if extent is not None and extent[0] not in found:
            found[extent[0]] = frames
    tensor = None
    release(made, pacer)
    return found


def _site(frames: Any, roots: Tuple[str, ...]) -> Tuple[Site, List[str]]:
    """((file and line allocated at, the job's own innermost line), the traceback oldest first)
    of tracemalloc's raw frames; all None without frames."""
    if not frames:
        return (None, None, None, None), []
    oldest_first = [(str(file), int(line)) for file, line in reversed(frames)]
    file, line = oldest_first[-1]
    job = next(((f, n) for f, n in reversed(oldest_first) if not is_library(f, roots)), (None, None))
    return (file, line, job[0], job[1]), [f"{f}:{n}" for f, n in oldest_first]


def tensor_kinds(census: Census) -> Tuple[type, ...]:
    """The tensor types to look for: torch's, and every subclass the census met."""
    torch = imported("torch")
    tensor = getattr(torch, "Tensor", None)
    if not isinstance(tensor, type):
        return ()
    kinds = {tensor}
    parameter = getattr(getattr(torch, "nn", None), "Parameter", None)
    if isinstance(parameter, type):
        kinds.add(parameter)
    for kind in census.counts:
        try:
            if issubclass(kind, tensor):
                kinds.add(kind)
        except Exception:  # noqa: BLE001 - a metaclass with a strange __subclasscheck__
            continue
    return tuple(kinds)


def unmeasured(before: Census, after: Census) -> Optional[str]:
    """Why the two censuses cannot tell which storages are new, or None when they can: a storage
    the first census did not reach would count as new, and the second one must reach the new ones
    (a leak's tensors soon live in gc's oldest generation, the one a small budget leaves out)."""
    for which, census in (("before", before), ("after", after)):
        if census.skipped:
            skipped = census.skipped[0]
            return (
                f"the census {which} the window did not list gc's generation {skipped.generation} "
                f"(listing it would hold the job's GIL about {skipped.stall_s * 1e3:.0f} ms in one go); "
                f"--scan-budget {max(1, math.ceil(skipped.stall_s * 100 * 1.5))} allows that"
            )
        if census.out_of_time:
            return f"the census {which} the window ran out of its {census.budget_s:g} s; raise --scan-budget"
    return None


def tensor_growth(
    before: Census, after: Census, made_by: Dict[int, Any], budget_s: float, top: int, pacer: Pacer
) -> Tuple[Dict[str, Any], List[str]]:
    """The storages in `after` that `before` did not have, grouped by device and the lines that
    made them, largest first, each group with what holds its storages; and notes. Nothing is
    compared where the censuses cannot say (`unmeasured`): the result's "unmeasured" says why."""
    why = unmeasured(before, after)
    if why is not None:
        return {"sites": [], "site_count": 0, "new_mb": {}, "holders_looked": 0, "holders_s": 0.0,
                "unmeasured": why}, []  # fmt: skip
    groups, new_bytes = _new_storages(before, after, made_by, pacer)
    ranked = sorted(groups.items(), key=lambda item: -item[1][0])
    shown = ranked[:top]
    holders, took, notes = _holders_of(shown, budget_s, pacer)
    result = {
        "sites": _sites_with_holders(shown, holders),
        "site_count": len(ranked),
        "new_mb": {device: size / MB for device, size in sorted(new_bytes.items())},
        "holders_looked": holders.looked,
        "holders_s": took,
        "unmeasured": None,
    }
    return result, notes


# (device, where it was made) -> [bytes, storages, traceback, [(bytes, storage key)...]]
_Groups = Dict[Tuple[str, Site], List[Any]]


def _new_storages(
    before: Census, after: Census, made_by: Dict[int, Any], pacer: Pacer
) -> Tuple[_Groups, Dict[str, int]]:
    """The storages in `after` that `before` did not have, grouped by device and the lines that
    made them; and the new bytes per device."""
    roots = library_roots()
    groups: _Groups = {}
    new_bytes: Dict[str, int] = {}
    known = before.storages
    for index, (key, size) in enumerate(after.storages.items()):  # the agent's own dict: no one changes it
        if not index & 1023:
            pacer.pause_if_due()
        if key in known:
            continue
        device = device_of(key)
        new_bytes[device] = new_bytes.get(device, 0) + size
        site, stack = _site(made_by.get(key), roots)
        entry = groups.get((device, site))
        if entry is None:
            entry = groups[(device, site)] = [0, 0, stack, []]
        entry[0] += size
        entry[1] += 1
        entry[3].append((size, key))
    return groups, new_bytes


def _holders_of(
    shown: List[Tuple[Tuple[str, Site], List[Any]]], budget_s: float, pacer: Pacer
) -> Tuple[Holders, float, List[str]]:
    """What holds the storages of the groups shown (at most NAMED_MAX of them, the largest
    groups' first), from a bounded walk; how long the walk took, and a note where it stopped."""
    wanted: Dict[int, int] = {}  # storage key -> bytes: the shown groups', the largest groups first
    for _, entry in shown:
        for size, key in entry[3][: NAMED_MAX - len(wanted)]:
            wanted[key] = size

    def match(tensor: Any) -> Optional[int]:
        extent = storage_extent(tensor)
        return extent[0] if extent is not None and extent[0] in wanted else None

    started = perf_counter()
    holders = find_holders(match, len(wanted), budget_s, pacer)
    took = perf_counter() - started
    notes = []
    if holders.cut is not None:
        bound = holders.stopped(budget_s)
        notes.append(
            f"tensor storage: what holds {len(wanted) - len(holders.found):,} of {len(wanted):,} new "
            f"storages is not named: the walk from the job's variables stopped ({bound}); raise --scan-budget"
        )
    return holders, took, notes


def _sites_with_holders(
    shown: List[Tuple[Tuple[str, Site], List[Any]]], holders: Holders
) -> List[Dict[str, Any]]:
    """The groups shown as memory --growth's tensor sites, each with its largest holders."""
    sites = []
    for (device, (file, line, job_file, job_line)), (size, count, stack, keys) in shown:
        by_holder: Dict[str, List[Any]] = {}  # holder -> [storages, bytes, an example path]
        for storage_size, key in keys:
            named = holders.found.get(key)
            if named is None:
                continue
            held_by = by_holder.setdefault(named[0], [0, 0, named[1]])
            held_by[0] += 1
            held_by[1] += storage_size
        held = sorted(by_holder.items(), key=lambda item: -item[1][1])
        sites.append({
            "device": device, "size_mb": size / MB, "storages": count,
            "file": file, "line": line, "job_file": job_file, "job_line": job_line, "traceback": stack,
            "held": sum(entry[0] for _, entry in held),
            "held_mb": sum(entry[1] for _, entry in held) / MB,
            "holders": [
                {"holder": holder, "storages": storages, "size_mb": held_bytes / MB, "example": example}
                for holder, (storages, held_bytes, example) in held[:HOLDERS_SHOWN]
            ],
        })  # fmt: skip
    return sites
