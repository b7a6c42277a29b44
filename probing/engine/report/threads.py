"""The threads a report draws, bounded: threads with the same stack and state folded into one
entry ("the same stack on N threads", as backtrace --ranks shows ranks), at most THREADS_SHOWN
entries, each with at most INNER_FRAMES + OUTER_FRAMES frames. A job of 5000 threads makes a
page of a few hundred entries, not 20 MB."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

THREADS_SHOWN = 200
INNER_FRAMES = 30  # the most recent calls: where the thread is
OUTER_FRAMES = 10  # the first calls: what started it
NAMES_SHOWN = 8  # of the other threads folded into one entry


def stack_key(thread: Dict[str, Any]) -> Tuple[Any, ...]:
    """What two threads share to be drawn as one entry (here, or across ranks: report_job.py)."""
    frames = tuple((f.get("func"), f.get("file"), f.get("lineno")) for f in thread["frames"])
    return (thread.get("state"), thread.get("activity"), thread.get("daemon"), frames)


def _order(thread: Dict[str, Any]) -> Tuple[Any, ...]:
    """Main first, a thread holding the GIL next, then threads not waiting, the biggest folds first."""
    state = str(thread.get("state") or "")
    return (not thread["is_main"], "GIL" not in state, "wait" in state, -thread["count"], str(thread["name"]))


def _cut_frames(frames: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Innermost first, as describe_threads gives them; the middle of a deep stack left out and
    one entry ({"elided": N}) says how many frames."""
    if len(frames) <= INNER_FRAMES + OUTER_FRAMES:
        return frames
    elided = len(frames) - INNER_FRAMES - OUTER_FRAMES
    return frames[:INNER_FRAMES] + [{"elided": elided}] + frames[-OUTER_FRAMES:]


def fold_threads(threads: List[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], int]:
    """describe_threads' entries folded and capped. Each entry gains `count` (threads it stands
    for) and `others` (a few of the other threads' names); the main thread is never folded.
    Also how many threads were left out past THREADS_SHOWN entries."""
    folded: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    entries: List[Dict[str, Any]] = []
    for thread in threads:
        key = stack_key(thread)
        if not thread["is_main"] and key in folded:
            entry = folded[key]
            entry["count"] += 1
            if len(entry["others"]) < NAMES_SHOWN:
                entry["others"].append(thread.get("name"))
            continue
        entry = dict(thread, count=1, others=[], frames=_cut_frames(thread["frames"]))
        entries.append(entry)
        if not thread["is_main"]:
            folded[key] = entry
    entries.sort(key=_order)
    rest = entries[THREADS_SHOWN:]
    return entries[:THREADS_SHOWN], sum(entry["count"] for entry in rest)
