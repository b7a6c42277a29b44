"""memory --growth: what grew in a window of S seconds, by allocation site and by object type,
and the tensor storage that grew, by the line that made it and what holds it (tensor_growth.py).

tracemalloc is started for the window when the job does not run it already, and stopped after
it: it slows every Python allocation of the job while it runs, so it never outlives the window
(nor the client that asked: a client that goes away ends the window early). What it costs is
measured and reported with the answer.
"""

from __future__ import annotations

import os
import tracemalloc
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ...originals import Event, allocate_lock, monotonic, perf_counter, thread_time
from ...procfs import memory_bytes
from ..lifecycle import WORK, on_stop
from ..pacing import Pacer, stall_bound
from ..requests import ErrorKind, RequestError
from .census import Census, take_census, type_name
from .cuda import MB, cuda_device_stats
from .job_code import AGENT_DIR, is_library, library_roots
from .tensor_growth import (
    Lookup,
    Made,
    catch_up,
    made_in_window,
    origins,
    tensor_growth,
    tensor_kinds,
    traceback_lookup,
)

FRAMES = 16  # deep enough to reach the job's own line below torch's and the stdlib's frames
CUDA_COUNTERS = (
    "allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current",
    "num_alloc_retries", "num_ooms",
)  # fmt: skip

_busy = allocate_lock()
_cancel = Event()
_tracing_for_window = False  # tracemalloc is on because a window started it


def cancel() -> None:
    """End a window now (a stop hook, at WORK: the agent is stopping). Safe to call again."""
    _cancel.set()


def _after_fork_in_child() -> None:
    # A DataLoader worker forked during a window inherits tracemalloc switched on, and no thread
    # of ours to switch it off: every allocation of the worker would pay for it for good.
    global _busy, _cancel, _tracing_for_window
    if _tracing_for_window:
        tracemalloc.stop()
    _busy, _cancel, _tracing_for_window = allocate_lock(), Event(), False


os.register_at_fork(after_in_child=_after_fork_in_child)


def _allocation_cost() -> float:
    """Seconds per small allocation here and now (best of three runs)."""
    best = float("inf")
    for _ in range(3):
        started = perf_counter()
        for _ in range(5000):
            [None]  # noqa: B018 - the allocation is the point
        best = min(best, perf_counter() - started)
    return best / 5000


def _sites(
    after: tracemalloc.Snapshot, before: tracemalloc.Snapshot, top: int
) -> Tuple[List[Dict[str, Any]], int]:
    """Allocation sites that grew, by (where it was allocated, the job's own line that led there)."""
    roots = library_roots()
    grouped: Dict[Tuple[str, int, Optional[str], Optional[int]], List[Any]] = {}
    for stat in after.compare_to(before, "traceback"):
        if stat.size_diff <= 0:
            continue
        frames = list(stat.traceback)  # oldest first
        if not frames or _agents_own(frames):
            continue
        site = frames[-1]
        job = next((frame for frame in reversed(frames) if not is_library(frame.filename, roots)), None)
        key = (site.filename, site.lineno, job.filename if job else None, job.lineno if job else None)
        entry = grouped.setdefault(key, [0, 0, [f"{frame.filename}:{frame.lineno}" for frame in frames]])
        entry[0] += stat.size_diff
        entry[1] += stat.count_diff
    ranked = sorted(grouped.items(), key=lambda item: -item[1][0])
    sites = [
        {"file": file, "line": line, "job_file": job_file, "job_line": job_line,
         "size_diff_mb": size / MB, "count_diff": count, "traceback": stack}
        for (file, line, job_file, job_line), (size, count, stack) in ranked[:top]
    ]  # fmt: skip
    return sites, len(ranked)


_TRACEMALLOC_FILE = tracemalloc.__file__.rstrip("co")  # tracemalloc.py, whether .pyc was named
_AGENT_PREFIX = os.path.join(AGENT_DIR, "")


def _agents_own(frames: List[Any]) -> bool:
    """Whether the traces of a traceback are the agent's own allocations while it watched: made
    in tracemalloc's module, or with a frame of the agent's. Judged once per traceback, not per
    trace with Snapshot.filter_traces: where the job runs tracemalloc itself (PYTHONTRACEMALLOC),
    a pass over its tens of thousands of traces, every allocation of it traced, took 2 s each."""
    if frames[-1].filename.rstrip("co") == _TRACEMALLOC_FILE:
        return True
    return any(frame.filename.startswith(_AGENT_PREFIX) for frame in frames)


def _type_changes(before: Census, after: Census, top: int) -> List[Dict[str, Any]]:
    changes: List[Dict[str, Any]] = []
    for kind in set(before.counts) | set(after.counts):
        old_count, new_count = before.counts.get(kind, 0), after.counts.get(kind, 0)
        count = new_count - old_count
        size = after.sizes.get(kind, 0) - before.sizes.get(kind, 0)
        tensor = kind in before.cuda or kind in after.cuda
        cuda = after.cuda.get(kind, 0) - before.cuda.get(kind, 0) if tensor else None
        if count > 0 or size > 0 or (cuda or 0) > 0:
            changes.append({
                "type": type_name(kind), "count_before": old_count, "count_after": new_count,
                "count_diff": count, "size_diff_mb": size / MB,
                "cuda_diff_mb": None if cuda is None else cuda / MB,
            })  # fmt: skip
    changes.sort(key=lambda change: (-change["size_diff_mb"], -change["count_diff"], change["type"]))
    return changes[:top]


def _cuda_counters() -> Dict[int, Dict[str, int]]:
    return {
        device: {name: int(stats.get(name, 0)) for name in CUDA_COUNTERS}
        for device, stats in cuda_device_stats()
    }


def _wait(seconds: float, client_gone: Any) -> bool:
    """Wait out the window; False when it ended early (client gone, agent stopping)."""
    deadline = monotonic() + seconds
    while True:
        remaining = deadline - monotonic()
        if remaining <= 0:
            return True
        if _cancel.wait(min(0.25, remaining)) or client_gone():
            return False


def watch(seconds: float, budget_s: float, top: int, client_gone: Any) -> Dict[str, Any]:
    if not _busy.acquire(blocking=False):
        raise RequestError(
            ErrorKind.BUSY, "another memory --growth is watching this process; try again when it ends"
        )
    try:
        _cancel.clear()
        return _watch(seconds, budget_s, top, client_gone)
    finally:
        _busy.release()


class _Window(NamedTuple):
    """What the traced window saw and cost, its snapshots apart (they are let go early)."""

    started_here: bool  # tracemalloc was started for the window
    watched: float  # seconds the window lasted
    completed: bool  # False: ended early (client gone, agent stopping)
    traced: Optional[float]  # seconds per small allocation with tracemalloc on (started here)
    traced_s: Optional[float]  # how long tracemalloc ran for the window (started here)
    traced_mb: float
    frames: int
    made: List[Made]
    made_notes: List[str]
    lookup_s: float


def _traced_window(
    seconds: float, budget_s: float, client_gone: Any, census_before: Census, kinds: Tuple[type, ...],
    lookup: Optional[Lookup], started_here: bool, pacer: Pacer,
) -> Tuple[_Window, tracemalloc.Snapshot, tracemalloc.Snapshot]:  # fmt: skip
    """The window, traced: tracemalloc's snapshots at its start and end, and what it saw and
    cost. tracemalloc, when started here, is stopped whatever happens."""
    global _tracing_for_window
    traced = tracing_since = traced_s = None
    completed = False
    made: List[Made] = []
    made_notes: List[str] = []
    lookup_s = 0.0
    try:
        catch_up(census_before, kinds, stall_bound(budget_s), pacer)
        if started_here:
            _tracing_for_window = True
            tracing_since = monotonic()
            tracemalloc.start(FRAMES)
            traced = _allocation_cost()
        before = tracemalloc.take_snapshot()
        window_started = monotonic()
        completed = _wait(seconds, client_gone)
        watched = monotonic() - window_started
        after = tracemalloc.take_snapshot()
        traced_mb = tracemalloc.get_tracemalloc_memory() / MB
        frames = tracemalloc.get_traceback_limit()
        if completed and not census_before.cut_short:  # else no storage can be called new
            # While tracemalloc still knows which objects were made in the window.
            looked = monotonic()
            made, made_notes = made_in_window(kinds, lookup, stall_bound(budget_s), budget_s, pacer)
            lookup_s = monotonic() - looked
    finally:
        if started_here:
            tracemalloc.stop()  # before the comparison: probing's own work needs no tracing
            _tracing_for_window = False
            if tracing_since is not None:
                traced_s = monotonic() - tracing_since
    window = _Window(
        started_here, watched, completed, traced, traced_s, traced_mb, frames, made, made_notes, lookup_s
    )
    return window, before, after


def _watch(seconds: float, budget_s: float, top: int, client_gone: Any) -> Dict[str, Any]:
    cpu_started = thread_time()
    rss_before, _ = memory_bytes()
    cuda_before = _cuda_counters()
    lookup = traceback_lookup()
    started_here = not tracemalloc.is_tracing()
    # Timed before the census, so that tracing starts right after it: a tensor made between the
    # two is new storage with no line.
    bare = _allocation_cost() if started_here else None
    census_before = take_census(budget_s)
    kinds = tensor_kinds(census_before)
    pacer = Pacer()
    on_stop(cancel, WORK)
    window, before, after = _traced_window(
        seconds, budget_s, client_gone, census_before, kinds, lookup, started_here, pacer
    )
    if not window.completed and (_cancel.is_set() or client_gone()):
        raise RequestError(
            ErrorKind.CANCELLED, "the window was ended early: the client left or the agent stopped"
        )
    made_by = origins(window.made, pacer)
    # Whatever the agent allocates while it watches is not the job's growth (_agents_own).
    sites, site_count = _sites(after, before, top)
    del before, after
    census_after = take_census(budget_s)
    tensors, tensor_notes = tensor_growth(census_before, census_after, made_by, budget_s, top, pacer)
    del made_by
    rss_after, _ = memory_bytes()
    cuda_after = _cuda_counters()
    cuda = []
    for device, counters in sorted(cuda_before.items()):
        if device in cuda_after:
            change = {name: cuda_after[device][name] - counters.get(name, 0) for name in CUDA_COUNTERS}
            cuda.append(dict(change, device=device))
    return _answer(
        seconds, top, window, (census_before, census_after), (rss_before, rss_after), sites, site_count,
        tensors, tensor_notes, cuda, bare, cpu_started,
    )  # fmt: skip


def _answer(
    seconds: float, top: int, window: _Window, censuses: Tuple[Census, Census],
    rss: Tuple[Optional[int], Optional[int]], sites: List[Dict[str, Any]], site_count: int,
    tensors: Dict[str, Any], tensor_notes: List[str], cuda: List[Dict[str, Any]], bare: Optional[float],
    cpu_started: float,
) -> Dict[str, Any]:  # fmt: skip
    """The answer to memory --growth, with what the window cost the job and the agent."""
    census_before, census_after = censuses
    rss_before, rss_after = rss
    notes = [f"{which} {note}" for which, census in (("before:", census_before), ("after:", census_after))
             for note in [census.note()] if note]  # fmt: skip
    return {
        "pid": os.getpid(),
        "seconds": seconds,
        "watched_s": window.watched,
        "completed": window.completed,
        "rss_mb_before": None if rss_before is None else rss_before / MB,
        "rss_mb_after": None if rss_after is None else rss_after / MB,
        "sites": sites,
        "site_count": site_count,
        "types": _type_changes(census_before, census_after, top),
        "objects_before": census_before.total,
        "objects_after": census_after.total,
        "tensor_storage_mb_before": {k: v / MB for k, v in census_before.storage_bytes.items()},
        "tensor_storage_mb_after": {k: v / MB for k, v in census_after.storage_bytes.items()},
        "tensor_sites": tensors["sites"],
        "tensor_site_count": tensors["site_count"],
        "tensor_storage_new_mb": tensors["new_mb"],
        "tensor_storage_unmeasured": tensors["unmeasured"],
        "cuda": cuda,
        "notes": notes + window.made_notes + tensor_notes,
        "overhead": {
            "tracemalloc_started": window.started_here,
            "tracemalloc_s": window.traced_s,
            "tensor_lookup_s": window.lookup_s,
            "holders_s": tensors["holders_s"],
            "frames": window.frames,
            "allocation_us": None if bare is None else bare * 1e6,
            "traced_allocation_us": None if window.traced is None else window.traced * 1e6,
            "tracemalloc_mb": window.traced_mb,
            "agent_cpu_s": thread_time() - cpu_started,
        },
    }
