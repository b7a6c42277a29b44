"""Rank numbers as a line of text: `0-3,5`, `ranks 0, 1, 2`, `ranks 0-126,128-1023`. Pure."""

from __future__ import annotations

# No typing at run time: `backtrace --ranks all` names ranks through here (engine/jobs/job.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Sequence

# Up to this many ranks are listed one by one ("ranks 0, 1, 2"); more as runs ("ranks 0-126,
# 128-1023"): a verdict over 1 024 ranks is one line, not a page of numbers.
LISTED_RANKS = 8


def rank_runs(ranks: Sequence[int], shortest: int) -> str:
    """`ranks` in order, each run of at least `shortest` consecutive ones as a range: 0-3,5."""
    ordered = sorted(set(ranks))
    parts: List[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        if end - start + 1 >= shortest:
            parts.append(f"{ordered[start]}-{ordered[end]}")
        else:
            parts.extend(str(rank) for rank in ordered[start : end + 1])
        start = end + 1
    return ",".join(parts)


def rank_numbers(ranks: Sequence[int]) -> str:
    """The numbers of `ranks`: each of a few, or runs of consecutive ones as ranges."""
    ordered = sorted(set(ranks))
    if len(ordered) <= LISTED_RANKS:
        return ", ".join(str(rank) for rank in ordered)
    return rank_runs(ordered, 2)


def ranks_text(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(set(ranks)) > 1 else ''} {rank_numbers(ranks)}"
