"""Flame graphs of several ranks of a job at once (`flamegraph --ranks`): each rank is sampled,
or its module times read, in a thread of its own over the same window, exactly as one process
would be (fanout.gather); the pictures are then drawn side by side, each under a root frame
`rank N`. A rank that spends its time elsewhere (in a data loader while the others wait in an
all_reduce) is a tower of another shape, next to its peers."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from ...outside.pyspy import outside_budget
from ..jobs.fanout import Gathered, gather
from ..jobs.job import Rank
from ..target import Target
from .sampled import PING_TIMEOUT_S, REPLY_SLACK_S, Flame


def sampling_deadline(duration: float, timeout: float, attach_timeout: float) -> float:
    """How long the slowest rank may take: attach, the early look, the window and the agent's
    reply, then (an agent that stopped answering while it sampled) the window again from outside,
    with what py-spy gets beyond it (flame.sample_with_pyspy)."""
    agent = attach_timeout + PING_TIMEOUT_S + duration + timeout + REPLY_SLACK_S
    return agent + duration + outside_budget(timeout)


def job_flame(
    ranks: List[Rank], target_of: Callable[[Rank], Target], one: Callable[[Target], Flame], deadline_s: float
) -> Tuple[Flame, Gathered]:
    """`one(target)` for every rank at once, merged under a frame per rank; what did not answer
    is in the Gathered (a rank's own error when no rank answered is raised).

    Sampled stacks are drawn in seconds (a rank's counts over its rate): each rank's agent paces
    itself by what a sample costs there, and py-spy samples at the rate asked, so counts of two
    ranks are not on one scale, and their seconds are."""
    gathered = gather(ranks, lambda rank: one(target_of(rank)), deadline_s)
    if not gathered.answers:
        raise gathered.missing[0].error
    answers = sorted(gathered.answers, key=lambda answer: answer[0].rank)
    notes = [f"rank {rank.rank}: {note}" for rank, flame in answers for note in flame.notes]
    notes += [f"rank {rank.rank}: nothing to draw" for rank, flame in answers if not flame.stacks]
    flames = [flame for _, flame in answers]
    numbers = [rank.rank for rank, _ in answers]
    if flames[0].unit == "seconds":
        scales = [1.0] * len(flames)
        figures = _module_figures(flames)
        what = f"mean time per step by module, {figures['range']}"
    else:
        scales = [1.0 / float(flame.figures.get("rate_hz") or 1.0) for flame in flames]
        figures = _sample_figures(numbers, flames)
        what = "sampled stacks of every thread, in seconds of each thread's time"
    figures["ranks"] = len(answers)
    stacks = [
        ((f"rank {number}", *names), weight * scale)
        for number, flame, scale in zip(numbers, flames, scales)
        for names, weight in flame.stacks
    ]
    word = "rank" if len(numbers) == 1 else "ranks"
    return Flame(stacks, "seconds", f"{word} {_numbers_text(numbers)}: {what}", notes, figures), gathered


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


def _rounded(value: Any, digits: int) -> Any:
    if not isinstance(value, (int, float)):
        return None
    return int(round(value)) if digits == 0 else round(value, digits)


def _sample_figures(numbers: List[int], flames: List[Flame]) -> Dict[str, Any]:
    outside = [number for number, flame in zip(numbers, flames) if flame.figures.get("source") != "agent"]
    figures: Dict[str, Any] = {
        "sampled": True,
        "outside": outside,
        "duration_s": _spread([_rounded(flame.figures.get("duration_s"), 1) for flame in flames]),
        "rate_hz": _spread([_rounded(flame.figures.get("rate_hz"), 0) for flame in flames]),
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
