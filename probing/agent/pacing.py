"""Work in the agent's threads, cut into slices that let the job's threads run in between.

Pure-Python work in an agent thread gives the GIL up only when another thread has waited the
switch interval (5 ms) for it, and every time a training thread lets the GIL go (a torch op, a
collective's wait) and wants it back it may wait those 5 ms again: a scan of a second makes a
12 ms step take hundreds. So a long walk calls `Pacer.pause_if_due()` every few hundred items:
after SLICE_S of work the agent sleeps PAUSE_S, and any thread of the job waiting for the GIL
takes it. What a single C call holds (listing gc's objects, decoding a blob) is bounded by its
callers, who estimate it first (memory/objects.py, pytorch/flight_recorder.py).

DESIGN.md, "Agent rules": no request holds the job's GIL for more than ~10 ms at a stretch.
"""

from __future__ import annotations

from ..originals import perf_counter, sleep

# The most any request may hold the job's GIL in one go: what a C call the agent cannot cut
# (listing a generation of gc's objects, the Flight Recorder's decode) is estimated against.
MAX_STALL_S = 0.01
# Work between two pauses: well under MAX_STALL_S, so that a thread of the job that wants the
# GIL waits at most this long for it (plus the machine's scheduling).
SLICE_S = 0.002
# A pause long enough for a thread woken by the GIL's release to be scheduled and take it.
PAUSE_S = 0.0005


class Pacer:
    """Counts the agent's work in slices; `pause_if_due()` sleeps once a slice is used up."""

    __slots__ = ("_slice_end", "pauses")

    def __init__(self) -> None:
        self._slice_end = perf_counter() + SLICE_S
        self.pauses = 0

    def pause_if_due(self) -> bool:
        """Sleep PAUSE_S if this slice is used up; True if it slept."""
        if perf_counter() < self._slice_end:
            return False
        self.pause()
        return True

    def pause(self) -> None:
        """Let the job's threads run now, and start a fresh slice."""
        sleep(PAUSE_S)
        self.pauses += 1
        self._slice_end = perf_counter() + SLICE_S


def stall_bound(scan_budget_s: float) -> float:
    """The longest one C call of a scan may hold the GIL: MAX_STALL_S, or a hundredth of a
    scan budget the user raised (`--scan-budget 20` accepts 200 ms at once to count it all)."""
    return max(MAX_STALL_S, scan_budget_s / 100.0)
