"""Memory: the process.memory sampler, the census of live objects, torch's allocators.

The sampler is the one timer the agent runs by default: the value of process.memory is the
history from *before* someone noticed the job growing, so it has to be recording already. One
sample reads /proc/self/statm and /proc/self/stat (tens of microseconds); counting the objects gc
tracks is the expensive part (30 ms for a million objects, holding the GIL), so it is done only
as often as keeps it under GC_COUNT_SHARE of the time, and the rows in between have NULL there.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import threading
import time
from types import FunctionType
from typing import Any, Dict, List, Optional, Set, Tuple

from ...procfs import (
    memory_and_threads,
    memory_bytes,
    open_descriptor_count,
    peak_resident_bytes,
    process_start_time,
    thread_count,
)

MB = 1024.0 * 1024.0
DEFAULT_INTERVAL_S = 1.0
DEFAULT_HISTORY_S = 24 * 3600.0
GC_COUNT_SHARE = 0.0003  # counting gc objects may take 0.03% of the time
# One count holds the GIL throughout; past this the sampler stops counting (gc_objects NULL) rather
# than stall every thread of a job with tens of millions of objects that long.
GC_COUNT_MAX_S = 0.2
MIN_INTERVAL_S = 0.1
MAX_RING_ROWS = 1_000_000
SAMPLER_THREAD_NAME = "probing-memory"


def _seconds_from_environment(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("off", "no", "false"):
        return 0.0
    try:
        value = float(text)
    except ValueError:
        return default
    if not math.isfinite(value) or value < 0:
        return default
    return value if value == 0 else max(value, MIN_INTERVAL_S)


def cuda_module() -> Any:
    """torch.cuda when the job has imported torch and initialised CUDA; never initialises it."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        return cuda if cuda is not None and cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - a half-imported torch
        return None


def cuda_device_stats() -> List[Tuple[int, Dict[str, Any]]]:
    """(device, torch.cuda.memory_stats(device)) for every device; reading the caching
    allocator's counters creates no CUDA context."""
    cuda = cuda_module()
    if cuda is None:
        return []
    found = []
    for device in range(cuda.device_count()):
        try:
            found.append((device, dict(cuda.memory_stats(device))))
        except Exception:  # noqa: BLE001 - a device this process may not use
            continue
    return found


def cuda_totals() -> Tuple[Optional[float], Optional[float]]:
    """(allocated, reserved) MB over every CUDA device, or NULLs when CUDA is not in use."""
    cuda = cuda_module()
    if cuda is None:
        return None, None
    allocated = reserved = 0
    try:
        # memory_allocated() and memory_reserved() would each build the whole stats dict again.
        for device in range(cuda.device_count()):
            stats = cuda.memory_stats(device)
            allocated += stats.get("allocated_bytes.all.current", 0)
            reserved += stats.get("reserved_bytes.all.current", 0)
    except Exception:  # noqa: BLE001
        return None, None
    return allocated / MB, reserved / MB


def count_gc_objects() -> int:
    # One list per generation is half the cost of gc.get_objects() over all of them at once.
    return sum(len(gc.get_objects(generation)) for generation in range(3))


class Sampler:
    """process.memory: one row every `interval` seconds into a ring of `history` seconds."""

    def __init__(self, interval: float, history: float, own_threads: Set[int]) -> None:
        self.interval = interval
        self.history = history
        self.own_threads = own_threads
        self.ring: Any = None  # made by the thread: the agent's start imports nothing
        self.first: Optional[Tuple[Any, ...]] = None
        self.samples = 0
        self.cpu_s = 0.0  # CPU time the sampler itself used
        self.gc_every = 1
        self.gc_cost_s = 0.0
        self.gc_counting = True
        self.error: Optional[str] = None
        self.started_at = time.time()
        self._until_gc_count = 0
        self._wake = threading.Event()
        self._stopping = False
        start = process_start_time()
        elapsed = time.time() - start if start is not None else 0.0
        # The first sample's cpu_percent is the average since the process started.
        self._previous = (time.monotonic() - elapsed, 0.0)
        self.thread = threading.Thread(target=self._run, name=SAMPLER_THREAD_NAME, daemon=True)

    def _run(self) -> None:
        ident = threading.get_ident()
        self.own_threads.add(ident)
        try:
            self._loop()
        except Exception as error:  # noqa: BLE001 - an exception leaving the thread would print on stderr
            self.error = f"{type(error).__name__}: {error}"
        finally:
            self.own_threads.discard(ident)

    def _loop(self) -> None:
        if self.ring is None:  # a restarted sampler keeps the ring it had
            from ...schema.tables import PROCESS_MEMORY
            from ..ring import Ring

            rows = min(MAX_RING_ROWS, max(1, int(math.ceil(self.history / self.interval))))
            self.ring = Ring(PROCESS_MEMORY.name, PROCESS_MEMORY.column_types(), rows)
        next_at = time.monotonic()
        while not self._stopping:
            started = time.thread_time()
            try:
                self.sample()
            except Exception as error:  # noqa: BLE001 - never let sampling die silently
                self.error = f"{type(error).__name__}: {error}"
            self.cpu_s += time.thread_time() - started
            next_at = max(next_at + self.interval, time.monotonic())
            self._wake.wait(max(0.0, next_at - time.monotonic()))
            self._wake.clear()

    def reading(self, count_objects: bool) -> Tuple[Any, ...]:
        """One row of process.memory, read now."""
        now, monotonic, cpu = time.time(), time.monotonic(), time.process_time()
        rss, vms, threads = memory_and_threads()
        previous_wall, previous_cpu = self._previous
        cpu_percent = (
            100.0 * (cpu - previous_cpu) / (monotonic - previous_wall) if monotonic > previous_wall else None
        )
        self._previous = (monotonic, cpu)
        objects = None
        if count_objects:
            started = time.perf_counter()
            objects = count_gc_objects()
            self.gc_cost_s = time.perf_counter() - started
        allocated, reserved = cuda_totals()
        return (
            now, None if rss is None else rss / MB, None if vms is None else vms / MB, cpu_percent,
            threads, open_descriptor_count(), objects, allocated, reserved,
        )  # fmt: skip

    def sample(self) -> None:
        count = self.gc_counting and self._until_gc_count <= 0
        row = self.reading(count)
        if count and self.gc_cost_s > GC_COUNT_MAX_S:
            self.gc_counting = False
        if count:
            self.gc_every = max(1, int(math.ceil(self.gc_cost_s / (GC_COUNT_SHARE * self.interval))))
            self._until_gc_count = self.gc_every
        self._until_gc_count -= 1
        self.ring.append(row)
        if self.first is None:
            self.first = row
        self.samples += 1

    def set_interval(self, interval: float) -> None:
        self.interval = interval
        self._until_gc_count = 0
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def running(self) -> bool:
        return not self._stopping and self.thread.is_alive()

    def status(self) -> Dict[str, Any]:
        alive = time.time() - self.started_at
        return {
            "running": self.running(),
            "interval_s": self.interval,
            "history_s": self.history,
            "samples": self.samples,
            "rows": len(self.ring) if self.ring is not None else 0,
            "since": self.first[0] if self.first is not None else None,
            "gc_count_every": self.gc_every if self.gc_counting else None,
            "gc_count_s": self.gc_cost_s,
            "cpu_s": self.cpu_s,
            "cpu_share": self.cpu_s / alive if alive > 0 else 0.0,
            "error": self.error,
        }


_sampler: Optional[Sampler] = None
_lock = threading.Lock()


def current() -> Optional[Sampler]:
    return _sampler


def start_sampling(own_threads: Set[int], interval: Optional[float] = None) -> Optional[Sampler]:
    """Start (or re-time) the sampler. At agent start the interval comes from
    PROBING_MEMORY_INTERVAL (seconds, default 1; 0 or off: no sampling) and the history from
    PROBING_MEMORY_HISTORY (seconds, default 24 h)."""
    global _sampler
    if interval is None:
        interval = _seconds_from_environment("PROBING_MEMORY_INTERVAL", DEFAULT_INTERVAL_S)
    with _lock:
        sampler = _sampler
        if interval <= 0:
            if sampler is not None:
                sampler.stop()
            return sampler
        if sampler is not None and sampler.running():
            sampler.set_interval(interval)
            return sampler
        history = _seconds_from_environment("PROBING_MEMORY_HISTORY", DEFAULT_HISTORY_S) or DEFAULT_HISTORY_S
        fresh = Sampler(interval, history, own_threads)
        if sampler is not None:  # restarted after `--interval 0`: keep what was recorded
            fresh.ring, fresh.first, fresh.samples = sampler.ring, sampler.first, sampler.samples
        fresh.thread.start()  # returns once the thread runs, so its ident is known
        if fresh.thread.ident is not None:
            own_threads.add(fresh.thread.ident)
        _sampler = fresh
        return fresh


def stop_sampling() -> None:
    global _sampler
    with _lock:
        sampler, _sampler = _sampler, None
    if sampler is not None:
        sampler.stop()


def forget_after_fork() -> None:
    # The child of a fork has no sampler thread: a DataLoader worker must not inherit one.
    global _sampler, _lock
    _sampler, _lock = None, threading.Lock()


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
        self.generations: List[int] = []
        self.seen = 0
        self.total = 0
        self.cut_short = False
        self.elapsed_s = 0.0
        self.budget_s = 0.0
        self.tensors = 0
        self.storage_bytes: Dict[str, int] = {}  # device -> bytes of distinct storages

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

    def note(self) -> Optional[str]:
        if not self.cut_short:
            return None
        if self.seen == self.total:
            return (
                f"the object scan ran out of its {self.budget_s:g} s while summing tensor storage: "
                "storage sizes are partial; raise --scan-budget to count them all"
            )
        return (
            f"the object scan was cut short after {self.budget_s:g} s: {self.seen:,} of {self.total:,} "
            "objects counted; raise --scan-budget to count them all"
        )

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
    torch = sys.modules.get("torch")
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


def _sizing(kind: type, tensor_type: Optional[type], storage_types: Tuple[type, ...]) -> int:
    if tensor_type is not None and _is_subclass(kind, tensor_type):
        return TENSOR
    module = getattr(kind, "__module__", None)
    if isinstance(module, str) and module.startswith(__package__ + "."):
        return OWN
    if storage_types and _is_subclass(kind, storage_types):
        return SHALLOW
    try:
        if isinstance(getattr(kind, "__sizeof__", None), FunctionType):
            return SHALLOW
    except Exception:  # noqa: BLE001
        return SHALLOW
    return PLAIN


def take_census(budget_s: float) -> Census:
    """Count every object gc tracks by type, until `budget_s` runs out.

    A Python loop, so the job's threads get the GIL every switch interval; listing a generation
    (gc.get_objects) is one C call that holds it throughout (~30 ms a million objects).
    """
    census = Census()
    census.budget_s = budget_s
    started = time.perf_counter()
    deadline = started + budget_s
    tensor_type, storage_types = _torch_types()
    # type -> [count, bytes, how it is sized]: one lookup per object; turned into dicts of plain
    # ints at the end, and these lists freed.
    entries: Dict[type, List[int]] = {}
    storage = _StorageReach()
    getsizeof, shallow_size = sys.getsizeof, object.__sizeof__
    clock = time.perf_counter
    own = 0
    for generation in range(3):
        objects = gc.get_objects(generation)
        census.generations.append(len(objects))
        census.total += len(objects)
        if census.cut_short:
            continue
        for index, obj in enumerate(objects):
            if not index & 4095 and clock() > deadline:
                census.cut_short = True
                census.seen += index
                break
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
        del objects
    census.total -= own
    census.seen -= own
    for kind, entry in entries.items():
        if entry[2] != OWN:
            census.counts[kind], census.sizes[kind] = entry[0], entry[1]
    del entries
    census.seen = min(census.seen, census.total)
    census.tensors = storage.tensors
    storage.settle(census)
    census.elapsed_s = time.perf_counter() - started
    return census


def _is_subclass(kind: type, base: Any) -> bool:
    try:
        return issubclass(kind, base)
    except Exception:  # noqa: BLE001
        return False


class _StorageReach:
    """Each storage once: views and parameters sharing memory are not counted twice.

    The storage is found from the tensor's address and offset rather than with
    tensor.untyped_storage(), which would give every storage a Python object that lives as long
    as the storage does: a census must not add objects to the job. A storage's size is the
    furthest byte any of its live tensors reaches (views count what they see), so it is a lower
    bound: a small slice that alone keeps a big buffer alive counts as the slice.
    """

    def __init__(self) -> None:
        self.reach: Dict[Tuple[str, int], int] = {}
        self.owner: Dict[Tuple[str, int], type] = {}
        self.tensors = 0

    def add(self, tensor: Any) -> None:
        self.tensors += 1
        try:
            element = tensor.element_size()
            offset = tensor.storage_offset()
            base = tensor.data_ptr() - offset * element
            if base == 0:
                return  # meta tensors, empty storages
            end = offset + 1
            for length, stride in zip(tensor.shape, tensor.stride()):
                if length == 0:
                    end = offset
                    break
                end += (length - 1) * stride
            key = (str(tensor.device), base)
        except Exception:  # noqa: BLE001 - sparse, nested or fake tensors
            return
        if self.reach.get(key, -1) < end * element:
            self.reach[key] = end * element
            self.owner.setdefault(key, type(tensor))

    def settle(self, census: Census) -> None:
        for key, size in self.reach.items():
            device = key[0]
            census.storage_bytes[device] = census.storage_bytes.get(device, 0) + size
            kind = self.owner[key]
            if device == "cpu":
                census.sizes[kind] += size
            elif device.startswith("cuda"):
                census.cuda[kind] = census.cuda.get(kind, 0) + size
        for kind in self.owner.values():
            census.cuda.setdefault(kind, 0)


def generation_rows() -> List[Tuple[int, int, int, int, int, int, int, bool]]:
    """(generation, objects, threshold, pending, collections, collected, uncollectable, enabled)."""
    counts, thresholds, stats = gc.get_count(), gc.get_threshold(), gc.get_stats()
    enabled = gc.isenabled()
    rows = []
    for generation in range(min(3, len(stats))):
        stat = stats[generation]
        rows.append((
            generation, len(gc.get_objects(generation)),
            thresholds[generation] if generation < len(thresholds) else 0,
            counts[generation] if generation < len(counts) else 0,
            stat.get("collections", 0), stat.get("collected", 0), stat.get("uncollectable", 0), enabled,
        ))  # fmt: skip
    return rows


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
    now = time.time()
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
            "gc_objects": _difference(census.total, first[6]),
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
        "notes": [note for note in [census.note()] if note],
    }
