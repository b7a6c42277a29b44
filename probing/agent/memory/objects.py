"""The objects gc tracks, listed one generation at a time, and only where the listing is
estimated to hold the job's GIL no longer than a bound (pacing.MAX_STALL_S by default).

`gc.get_objects(generation)` is one C call that holds the GIL for the whole generation (30 ms a
million objects on a quiet machine; 130-350 ns an object on a loaded 2-core one, where `import
torch` alone leaves 160 000 objects in the oldest generation), and freeing the list it returns
is another. CPython has no cheaper way to count a generation, so its size is estimated first:

- generation 0: `gc.get_count()[0]`, the allocations since it was last collected;
- generation 1: the survivors of generation 0's collections since its own last one, at most
  (`gc.get_count()[1]` + 1) times generation 0's threshold;
- the oldest: its size when it was last listed here, scaled by how the interpreter's
  allocated blocks (`sys.getallocatedblocks()`) changed since; one never listed: the blocks
  times RATIO_GUESS (the sampler lists every generation at start, while they are small, so
  under `PROBING=1` or `probing run` the size is always known);

and its cost from what listing that generation cost here per object (learnt from every listing;
rising at once, threefold at most, falling slowly, and easing toward the best ever timed while
the estimate keeps the generation unlisted). A generation that would take longer than the bound
is left out, and the caller says so (`Skipped.describe()`): a count is never silently short.
The lists are freed in slices (`release`), so that dropping a million references is no stall
either.
"""

from __future__ import annotations

import gc
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ...originals import perf_counter
from ..pacing import SLICE_S, Pacer

# What a listing is assumed to cost per object before one of that generation was timed here:
# the oldest generation's objects are scattered over the heap and cold in the caches (130-350 ns
# an object measured on a loaded 2-core machine, 30 ns on a quiet one), the youngest hot.
FIRST_COST_S = 150e-9
# Objects gc tracks per pymalloc block, assumed for a generation never listed (0.29 in a job that
# imported torch; a job of nothing but small containers has up to 1).
RATIO_GUESS = 0.35
# A listing teaches the cost per object only when it is long enough for its time to mean it.
MIN_TIMED_OBJECTS = 2000
GENERATIONS = 3

# generation -> seconds a listing costs per object (learnt), and the least ever timed
_cost_s: Dict[int, float] = {}
_best_s: Dict[int, float] = {}
# generation -> (objects when last listed, allocated blocks then)
_listed: Dict[int, Tuple[int, Optional[int]]] = {}


class Skipped(NamedTuple):
    """A generation not listed: about how many objects, and how long listing them would hold the GIL."""

    generation: int
    objects: int
    stall_s: float
    bound_s: float

    def describe(self) -> str:
        return (
            f"gc's generation {self.generation} (about {self.objects:,} objects) was not listed: listing it "
            f"would hold the job's GIL about {self.stall_s * 1e3:.0f} ms in one go, over the "
            f"{self.bound_s * 1e3:.0f} ms a request may (--scan-budget S allows S/100)"
        )


def _blocks() -> Optional[int]:
    try:
        return int(sys.getallocatedblocks())
    except Exception:  # noqa: BLE001 - an interpreter without pymalloc's counter
        return None


def estimated_size(generation: int) -> int:
    """About how many objects gc's `generation` holds now, without listing it."""
    counts, thresholds = gc.get_count(), gc.get_threshold()
    if generation == 0:
        return max(0, counts[0]) + 64
    if generation == 1 and len(counts) > 1:
        # Only the survivors of generation 0's collections since generation 1's last one: a
        # few thousand, whatever the heap holds (scaling an earlier listing by the heap's growth
        # once called 3 000 objects 16 ms).
        return (counts[1] + 1) * max(thresholds[0], 1)
    blocks = _blocks()
    listed = _listed.get(generation)
    if listed is not None:
        objects, then = listed
        return objects * blocks // then if blocks and then else objects
    return int((blocks or 0) * RATIO_GUESS)


def estimated_stall(generation: int) -> Tuple[int, float]:
    """(objects, seconds): about how long listing `generation` would hold the GIL."""
    objects = estimated_size(generation)
    return objects, objects * _cost_s.get(generation, FIRST_COST_S)


def list_generation(generation: int, bound_s: float) -> Tuple[Optional[List[Any]], Optional[Skipped]]:
    """gc's objects of `generation`, or (None, why) when listing them is estimated to hold the
    GIL longer than `bound_s`. The list is the caller's to `release`."""
    objects, stall = estimated_stall(generation)
    if stall > bound_s:
        # A cost learnt while the machine was busiest would keep the generation unlisted for
        # good: each estimate that stops a listing eases it toward the best ever timed here.
        if generation in _cost_s:
            _cost_s[generation] = max(_best_s[generation], 0.97 * _cost_s[generation])
        return None, Skipped(generation, objects, stall, bound_s)
    started = perf_counter()
    found = gc.get_objects(generation)
    took = perf_counter() - started
    _listed[generation] = (len(found), _blocks())
    if len(found) >= MIN_TIMED_OBJECTS:
        measured = took / len(found)
        known = _cost_s.get(generation, FIRST_COST_S)
        # Rising at once (but threefold at most: one listing the machine preempted is no rule),
        # falling slowly.
        _cost_s[generation] = min(measured, 3 * known) if measured > known else 0.75 * known + 0.25 * measured
        _best_s[generation] = min(_best_s.get(generation, measured), measured)
    return found, None


def release(objects: List[Any], pacer: Pacer, per_item_s: Optional[float] = None) -> None:
    """Drop a list's references in slices: one `del` of a million would be one long C call. A
    listing's items cost what listing them did; others (rows that free their values with them)
    say what each costs."""
    chunk = max(64, int(SLICE_S / max(per_item_s or _cost_s.get(GENERATIONS - 1, FIRST_COST_S), 1e-9)))
    while objects:
        del objects[-chunk:]
        pacer.pause_if_due()


def count_objects(bound_s: float, pacer: Pacer) -> Tuple[Optional[int], List[Skipped], float]:
    """(objects gc tracks or None, the generations left out, seconds spent listing)."""
    total = 0
    skipped = []
    spent = 0.0
    for generation in range(GENERATIONS):
        started = perf_counter()
        objects, why = list_generation(generation, bound_s)
        spent += perf_counter() - started
        if objects is None:
            if why is not None:
                skipped.append(why)
            continue
        total += len(objects)
        release(objects, pacer)
        pacer.pause()
    return (None if skipped else total), skipped, spent


def forget() -> None:
    """What was learnt (a fork's child, tests)."""
    _cost_s.clear()
    _best_s.clear()
    _listed.clear()
