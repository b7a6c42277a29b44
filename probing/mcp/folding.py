"""A backtrace's rows (one per frame, as `backtrace --format json` prints them) as threads, each
stack once with the ranks (and PIDs) that share it: what an assistant reads of 64 ranks is the
few stacks they are in, not 64 copies of one."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ..analysis.rank_ranges import rank_runs

# Threads named in the one-line summary; the structured answer has every one.
SUMMARY_THREADS = 6


def fold_stacks(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Threads (main threads first, then by name), each {name, ranks, pids, frames}: `frames`
    outermost first, `func (file:line)`; `ranks` None for one process."""
    stacks: Dict[Tuple[Any, Any, Any], List[Tuple[int, str]]] = {}
    names: Dict[Tuple[Any, Any, Any], Tuple[str, bool]] = {}
    for row in rows:
        key = (row.get("rank"), row.get("pid"), row.get("thread_id"))
        frame = f"{row.get('func')} ({row.get('file')}:{row.get('lineno')})"
        stacks.setdefault(key, []).append((int(row.get("depth") or 0), frame))
        names[key] = (str(row.get("thread_name") or row.get("thread_id")), bool(row.get("is_main")))
    folded: Dict[Tuple[str, bool, Tuple[str, ...]], Dict[str, Any]] = {}
    for key, frames in stacks.items():
        name, is_main = names[key]
        ordered = tuple(frame for _, frame in sorted(frames, reverse=True))  # depth 0 is innermost
        thread = folded.setdefault(
            (name, is_main, ordered),
            {"name": name, "is_main": is_main, "ranks": [], "pids": [], "frames": list(ordered)},
        )
        thread["pids"].append((key[0], key[1]))
    for thread in folded.values():
        members = sorted(
            set(thread["pids"]), key=lambda member: (member[0] is None, member[0] or 0, member[1])
        )
        thread["ranks"] = [rank for rank, _ in members if rank is not None] or None
        thread["pids"] = list(dict.fromkeys(pid for _, pid in members))
    threads = sorted(folded.values(), key=lambda t: (not t["is_main"], t["name"], t["ranks"] or []))
    return threads


def backtrace_summary(threads: List[Dict[str, Any]]) -> str:
    """One line per folded thread, at most SUMMARY_THREADS: who, and its innermost frame."""
    lines = []
    for thread in threads[:SUMMARY_THREADS]:
        who = (
            thread["name"]
            if thread["ranks"] is None
            else f"{thread['name']} of ranks {rank_runs(thread['ranks'], 3)}"
        )
        lines.append(f"{who}: {thread['frames'][-1] if thread['frames'] else '(no Python frame)'}")
    if len(threads) > SUMMARY_THREADS:
        lines.append(f"... and {len(threads) - SUMMARY_THREADS} more stacks (in the structured result)")
    return "\n".join(lines) or "no thread"
