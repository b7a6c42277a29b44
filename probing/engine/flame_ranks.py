"""Flame graphs of several ranks of a job at once (`flamegraph --ranks`): each rank is sampled,
or its module times read, in a thread of its own over the same window, exactly as one process
would be (fanout.gather); the pictures are then drawn side by side, each under a root frame
`rank N`. A rank that spends its time elsewhere (in a data loader while the others wait in an
all_reduce) is a tower of another shape, next to its peers."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from .fanout import Gathered, gather
from .flame import PING_TIMEOUT_S, REPLY_SLACK_S, Flame
from .job import Rank
from .target import Target

# Beyond the ranks' own timeouts: py-spy's start when a rank is read from outside.
OUTSIDE_SLACK_S = 5.0


def sampling_deadline(duration: float, timeout: float, attach_timeout: float) -> float:
    """How long the slowest rank may take to sample: attach, the early look, the window, the
    agent's reply or py-spy's."""
    return attach_timeout + PING_TIMEOUT_S + duration + timeout + REPLY_SLACK_S + OUTSIDE_SLACK_S


def job_flame(
    ranks: List[Rank], target_of: Callable[[Rank], Target], one: Callable[[Target], Flame], deadline_s: float
) -> Tuple[Flame, Gathered]:
    """`one(target)` for every rank at once, merged under a frame per rank; what did not answer
    is in the Gathered (a rank's own error when no rank answered is raised)."""
    gathered = gather(ranks, lambda rank: one(target_of(rank)), deadline_s)
    if not gathered.answers:
        raise gathered.missing[0].error
    answers = sorted(gathered.answers, key=lambda answer: answer[0].rank)
    stacks = [
        ((f"rank {rank.rank}", *names), weight) for rank, flame in answers for names, weight in flame.stacks
    ]
    notes = [f"rank {rank.rank}: {note}" for rank, flame in answers for note in flame.notes]
    flames = [flame for _, flame in answers]
    numbers = [rank.rank for rank, _ in answers]
    unit = flames[0].unit
    if unit == "seconds":
        figures = _module_figures(flames)
        what = f"mean time per step by module, {figures['range']}"
    else:
        figures = _sample_figures(flames)
        what = "sampled stacks of every thread"
    figures["ranks"] = len(answers)
    return Flame(stacks, unit, f"ranks {_numbers_text(numbers)}: {what}", notes, figures), gathered


def _numbers_text(numbers: List[int]) -> str:
    if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}-{numbers[-1]}"
    return ",".join(str(number) for number in numbers)


def _spread(values: List[Any]) -> Any:
    """One value where the ranks agree, else `low-high`."""
    known = sorted({value for value in values if value is not None})
    if not known:
        return None
    return known[0] if len(known) == 1 else f"{known[0]}-{known[-1]}"


def _sample_figures(flames: List[Flame]) -> Dict[str, Any]:
    sources = {flame.figures.get("source") or "py-spy" for flame in flames}
    figures: Dict[str, Any] = {
        "source": sources.pop() if len(sources) == 1 else "mixed",
        "samples": sum(int(flame.figures.get("samples") or 0) for flame in flames),
        "duration_s": _spread([flame.figures.get("duration_s") for flame in flames]),
        "rate_hz": _spread([flame.figures.get("rate_hz") for flame in flames]),
    }
    shares = [flame.figures["cost_share"] for flame in flames if flame.figures.get("cost_share") is not None]
    if shares:
        figures["cost_share"] = max(shares)  # the rank that paid the most
    return figures


def _module_figures(flames: List[Flame]) -> Dict[str, Any]:
    ranges = []
    for flame in flames:
        shown = str(flame.figures.get("range"))
        if shown not in ranges:
            ranges.append(shown)
    return {
        "modules": max(int(flame.figures.get("modules") or 0) for flame in flames),
        "steps": _spread([flame.figures.get("steps") for flame in flames]),
        "range": "; ".join(ranges),
    }
