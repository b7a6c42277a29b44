"""The census of live objects: what gc tracks, by type, with tensors' storage counted once;
and `probing PID memory`, the census beside what the sampler saw change since it started.

Every walk has a time budget and says when it was cut short. It runs in slices that let the
job's threads run between them (pacing.py); a generation whose listing alone would hold the
GIL longer than the request may (objects.py) is not counted, and the census says so.
"""

from __future__ import annotations

import gc
import os
import sys
from types import FunctionType
from typing import Any, Dict, List, Optional, Set, Tuple

from ...originals import perf_counter, wall_time
from ...procfs import memory_bytes, open_descriptor_count, peak_resident_bytes, thread_count
from ..imported import imported
from ..pacing import Pacer, stall_bound
from .cuda import MB, cuda_device_stats, cuda_module, cuda_totals
from .objects import GENERATIONS, Skipped, estimated_size, list_generation, release
from .sampler import current
from .storages import StorageReach, device_of


def type_name(kind: type) -> str:
    """`torch.Tensor`, `__main__.Batch`; builtins by their bare name, as Python shows them."""
    try:
        module = getattr(kind, "__module__", None)
        name = getattr(kind, "__qualname__", None) or kind.__name__
    except Exception:  # noqa: BLE001 - a metaclass with a strange __getattr__
        return repr(kind)
    if not isinstance(module, str) or module == "builtins":
        return str(name)
    return f"{module}.{name}"


class Census:
    """Live objects gc tracks, by type; tensors' storage counted once each."""

    def __init__(self) -> None:
        # type -> count, bytes (getsizeof, plus CPU tensor storage), CUDA storage bytes. Plain
        # ints in dicts: a second census (memory --growth) must not count a container per type
        # of the first one as the job's growth.
        self.counts: Dict[type, int] = {}
        self.sizes: Dict[type, int] = {}
        self.cuda: Dict[type, int] = {}  # tensor types only
        self.generations: List[Optional[int]] = []  # None: not listed (skipped)
        self.skipped: List[Skipped] = []
        self.seen = 0
        self.total = 0  # with the estimated size of a generation not listed
        self.cut_short = False  # out of time, or a generation skipped
        self.out_of_time = False
        self.elapsed_s = 0.0
        self.budget_s = 0.0
        self.tensors = 0
        self.storage_bytes: Dict[str, int] = {}  # device -> bytes of distinct storages
        self.storages: Dict[int, int] = {}  # storage key (storages.py) -> bytes its tensors reach

    def rows(self) -> List[Tuple[str, int, float, Optional[float]]]:
        """(type, count, size_mb, cuda_mb), largest first."""
        rows = [
            (
                type_name(kind),
                count,
                self.sizes[kind] / MB,
                self.cuda[kind] / MB if kind in self.cuda else None,
            )
            for kind, count in self.counts.items()
        ]
        rows.sort(key=lambda row: (-row[2], -row[1], row[0]))
        return rows

    def notes(self) -> List[str]:
        """What was not counted, and why: running out of the budget, then each generation left out."""
        notes = []
        if self.out_of_time and self.seen == self.total:
            notes.append(
                f"the object scan ran out of its {self.budget_s:g} s while summing tensor storage: "
                "storage sizes are partial; raise --scan-budget to count them all"
            )
        elif self.out_of_time:
            notes.append(
                f"the object scan was cut short after {self.budget_s:g} s: {self.seen:,} of {self.total:,} "
                "objects counted; raise --scan-budget to count them all"
            )
        for skipped in self.skipped:
            notes.append(
                f"{skipped.describe()}; {self.seen:,} objects of the other generations counted, "
                f"of about {self.total:,}"
            )
        return notes

    def note(self) -> Optional[str]:
        return "; ".join(self.notes()) or None

    def summary(self, top: int) -> Dict[str, Any]:
        return {
            "objects": self.total,
            "counted": self.seen,
            "cut_short": self.cut_short,
            "elapsed_s": self.elapsed_s,
            "generations": self.generations,
            "types": [
                {"type": name, "count": count, "size_mb": size, "cuda_mb": cuda}
                for name, count, size, cuda in self.rows()[:top]
            ],
            "tensors": self.tensors,
            "tensor_storage_mb": {device: size / MB for device, size in sorted(self.storage_bytes.items())},
        }


def _torch_types() -> Tuple[Optional[type], Tuple[type, ...]]:
    """(torch.Tensor, the storage classes) when the job has imported torch."""
    torch = imported("torch")
    if torch is None:
        return None, ()
    tensor = getattr(torch, "Tensor", None)
    storage = getattr(torch, "storage", None)
    storages = tuple(
        kind for kind in (getattr(storage, "_StorageBase", None), getattr(storage, "TypedStorage", None))
        if isinstance(kind, type)
    )  # fmt: skip
    return (tensor if isinstance(tensor, type) else None), storages


# How an object of a type is sized: as sys.getsizeof does; a tensor, whose storage is added once
# per storage; shallowly (object.__sizeof__): a storage object, whose __sizeof__ would count its
# tensors' memory again, and any type whose __sizeof__ is Python code (which could take seconds,
# or allocate, inside the job: pandas' deep memory_usage); not at all: the agent's own objects.
PLAIN, TENSOR, SHALLOW, OWN = 0, 1, 2, 3
YOUNG_IDS_MAX = 50_000
_AGENT_PACKAGE = __package__.rsplit(".", 1)[0] + "."  # probing.agent.: all of the agent, not memory/


def _sizing(kind: type, tensor_type: Optional[type], storage_types: Tuple[type, ...]) -> int:
    if tensor_type is not None and _is_subclass(kind, tensor_type):
        return TENSOR
    module = getattr(kind, "__module__", None)
    if isinstance(module, str) and module.startswith(_AGENT_PACKAGE):
        return OWN
    if storage_types and _is_subclass(kind, storage_types):
        return SHALLOW
    try:
        if isinstance(getattr(kind, "__sizeof__", None), FunctionType):
            return SHALLOW
    except Exception:  # noqa: BLE001
        return SHALLOW
    return PLAIN


def take_census(budget_s: float, bound_s: Optional[float] = None) -> Census:
    """Count every object gc tracks by type, until `budget_s` runs out.

    A Python loop in slices (pacing.py); a generation is listed (one C call holding the GIL)
    only where that is estimated to take at most `bound_s` (by default a hundredth of the
    budget, at least pacing.MAX_STALL_S), else left out and said (objects.py).
    """
    census = Census()
    census.budget_s = budget_s
    bound = stall_bound(budget_s) if bound_s is None else bound_s
    started = perf_counter()
    deadline = started + budget_s
    pacer = Pacer()
    tensor_type, storage_types = _torch_types()
    # type -> [count, bytes, how it is sized]: one lookup per object; turned into dicts of plain
    # ints at the end, and these lists freed.
    entries: Dict[type, List[int]] = {}
    storage = StorageReach()
    own = 0  # the agent's objects, and those counted twice: taken off the totals
    # The job runs between the listings of two generations, and a collection then may move an
    # object counted in a younger one into the next: those are known by their ids (the young
    # generations are small; past YOUNG_IDS_MAX the rare double count is let be).
    young: Optional[Set[int]] = set() if estimated_size(0) + estimated_size(1) <= YOUNG_IDS_MAX else None
    for generation in range(GENERATIONS):
        objects, skipped = list_generation(generation, bound)
        if objects is None:
            census.generations.append(None)
            if skipped is not None:
                census.skipped.append(skipped)
                census.total += skipped.objects
            census.cut_short = True
            continue
        census.generations.append(len(objects))
        census.total += len(objects)
        pacer.pause()
        if census.out_of_time:
            release(objects, pacer)
            continue
        own += _count_generation(
            objects, generation, census, entries, storage, young, deadline, pacer, tensor_type, storage_types
        )
        release(objects, pacer)
    census.total -= own
    census.seen -= own
    for kind, entry in entries.items():
        if entry[2] != OWN:
            census.counts[kind], census.sizes[kind] = entry[0], entry[1]
    del entries
    census.seen = min(census.seen, census.total)
    census.tensors = storage.tensors
    _settle(storage, census)
    census.elapsed_s = perf_counter() - started
    return census


def _count_generation(
    objects: List[Any], generation: int, census: Census, entries: Dict[type, List[int]],
    storage: StorageReach, young: Optional[Set[int]], deadline: float, pacer: Pacer, tensor_type: Any,
    storage_types: Any,
) -> int:  # fmt: skip
    """Count one generation's objects into `entries` (and tensors' storage into `storage`) until
    the deadline. Returns how many were the agent's own or counted twice, to take off the totals.
    This loop is the census's cost: one dict lookup per object, and no call that need not be."""
    getsizeof, shallow_size = sys.getsizeof, object.__sizeof__
    clock = perf_counter
    own = 0
    for index, obj in enumerate(objects):
        if not index & 255:
            if clock() > deadline:
                census.cut_short = census.out_of_time = True
                census.seen += index
                break
            pacer.pause_if_due()
        if young is not None:
            if generation < GENERATIONS - 1:
                young.add(id(obj))
            elif id(obj) in young:  # promoted while the job ran between two listings
                own += 1
                continue
        kind = type(obj)
        entry = entries.get(kind)
        if entry is None:
            entry = entries[kind] = [0, 0, _sizing(kind, tensor_type, storage_types)]
        how = entry[2]
        entry[0] += 1
        if how == OWN:
            own += 1
            continue
        try:
            entry[1] += getsizeof(obj) if how == PLAIN else shallow_size(obj)
        except Exception:  # noqa: BLE001 - a __sizeof__ of the job's that fails
            pass
        if how == TENSOR:
            storage.add(obj)
    else:
        census.seen += len(objects)
    obj = None
    return own


def _is_subclass(kind: type, base: Any) -> bool:
    try:
        return issubclass(kind, base)
    except Exception:  # noqa: BLE001
        return False


def _settle(storage: StorageReach, census: Census) -> None:
    """The storages' sizes into the census: CPU storage counts in its tensor type's size, CUDA
    storage apart; the storages kept by key (memory --growth compares two censuses' keys)."""
    for key, size in storage.reach.items():
        device = device_of(key)
        census.storage_bytes[device] = census.storage_bytes.get(device, 0) + size
        kind = storage.owner[key]
        if device == "cpu":
            census.sizes[kind] += size
        elif device.startswith("cuda"):
            census.cuda[kind] = census.cuda.get(kind, 0) + size
    for kind in storage.owner.values():
        census.cuda.setdefault(kind, 0)
    census.storages = storage.reach


def generation_rows(bound_s: float) -> Tuple[List[Tuple[Any, ...]], List[str]]:
    """(generation, objects, threshold, pending, collections, collected, uncollectable, enabled)
    per generation, objects NULL where counting them would hold the GIL past `bound_s`; notes."""
    counts, thresholds, stats = gc.get_count(), gc.get_threshold(), gc.get_stats()
    enabled = gc.isenabled()
    pacer = Pacer()
    rows = []
    notes = []
    for generation in range(min(GENERATIONS, len(stats))):
        stat = stats[generation]
        objects, skipped = list_generation(generation, bound_s)
        size = None
        if objects is not None:
            size = len(objects)
            release(objects, pacer)
        elif skipped is not None:
            notes.append(f"python.gc_generations: objects left NULL: {skipped.describe()}")
        pacer.pause()
        rows.append((
            generation, size,
            thresholds[generation] if generation < len(thresholds) else 0,
            counts[generation] if generation < len(counts) else 0,
            stat.get("collections", 0), stat.get("collected", 0), stat.get("uncollectable", 0), enabled,
        ))  # fmt: skip
    return rows, notes


def _mb(value: Optional[float]) -> Optional[float]:
    return None if value is None else value / MB


def _difference(now: Optional[float], then: Optional[float]) -> Optional[float]:
    return None if now is None or then is None else now - then


def _torch_summary(census: Census) -> Optional[Dict[str, Any]]:
    if "torch" not in sys.modules:
        return None
    devices = []
    for device, stats in cuda_device_stats():
        devices.append({
            "device": device,
            "allocated_mb": stats.get("allocated_bytes.all.current", 0) / MB,
            "max_allocated_mb": stats.get("allocated_bytes.all.peak", 0) / MB,
            "reserved_mb": stats.get("reserved_bytes.all.current", 0) / MB,
            "max_reserved_mb": stats.get("reserved_bytes.all.peak", 0) / MB,
            "alloc_retries": stats.get("num_alloc_retries", 0),
            "ooms": stats.get("num_ooms", 0),
        })  # fmt: skip
    return {
        "tensors": census.tensors,
        "storage_mb": {device: size / MB for device, size in sorted(census.storage_bytes.items())},
        "cuda_initialised": cuda_module() is not None,
        "cuda": devices,
    }


def summary(budget_s: float, top: int) -> Dict[str, Any]:
    """`probing PID memory`: where the memory is now, and how it changed since the agent started."""
    census = take_census(budget_s)
    rss, vms = memory_bytes()
    allocated, reserved = cuda_totals()
    now = wall_time()
    sampler = current()
    first = sampler.first if sampler is not None else None
    growth = None
    if first is not None:
        growth = {
            "since": first[0],
            "seconds": now - first[0],
            "rss_mb": _difference(_mb(rss), first[1]),
            "vms_mb": _difference(_mb(vms), first[2]),
            "num_threads": _difference(thread_count(), first[4]),
            "gc_objects": None if census.skipped else _difference(census.total, first[6]),
            "cuda_allocated_mb": _difference(allocated, first[7]),
            "cuda_reserved_mb": _difference(reserved, first[8]),
        }
    gc_summary = census.summary(top)
    gc_summary["collections"] = [stat.get("collections", 0) for stat in gc.get_stats()]
    gc_summary["enabled"] = gc.isenabled()
    return {
        "pid": os.getpid(),
        "rss_mb": _mb(rss),
        "vms_mb": _mb(vms),
        "rss_peak_mb": _mb(peak_resident_bytes()),
        "num_threads": thread_count(),
        "num_fds": open_descriptor_count(),
        "growth": growth,
        "sampler": sampler.status() if sampler is not None else None,
        "gc": gc_summary,
        "torch": _torch_summary(census),
        # The sampler's own gc counts left out are in its status, for whoever reads process.memory:
        # nothing printed here comes from them.
        "notes": census.notes(),
    }
