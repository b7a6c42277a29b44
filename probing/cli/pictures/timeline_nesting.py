"""Which call of python.torch_trace lies in which (a step's calls as spans, in whole
microseconds), and the stretch of a parent's span over a child that its hooks' order put partly
outside it: see cover_children. Part of the timeline (timeline.py)."""

from __future__ import annotations

import bisect
from typing import Any, Dict, List, Optional, Sequence, Tuple

# How far a child's span may stick out of its parent's and still be drawn inside it (see
# cover_children): a few hook calls' time, far below any module worth looking at.
NEST_SLACK_US = 50
# How deep calls of one module inside calls of itself are searched for a child's parent.
MAX_NESTED_CALLS = 64


class Call:
    """One row's span, in whole microseconds, while a step is laid out."""

    __slots__ = ("start", "end", "row", "depth", "parent")

    def __init__(self, start: int, end: int, row: Sequence[Any]) -> None:
        self.start = start
        self.end = end
        self.row = row
        name = str(row[3])
        self.depth = name.count(".")
        self.parent = name.rpartition(".")[0]


def cover_children(calls: List[Call]) -> None:
    """Stretch a parent's span over a child's that a hook's order put partly outside it.

    A parent and its first (or last) child begin (or end) at one event, timed by two hooks that
    run one after the other. In backward both prehooks sit on the same autograd node and the
    child's runs first, so the rows say the child's backward began before its parent's: by a
    microsecond or two, or by 100 us when `nan on` checks the gradient in the child's hook.
    A child's backward cannot begin before its parent's output gradient exists, so a backward
    child that starts before its parent and ends inside it stretches the parent's start, by any
    amount; elsewhere (forward, the ends) by at most NEST_SLACK_US. Drawn as measured, the two
    would partly overlap; a parent spans its children. The rows' exact durations stay in each
    event's args (duration_s).

    Each child is matched to its own parent call, on the calls' measured bounds: the innermost
    call of the parent's name (same stage) that contains it, else one it sticks out of by the
    slack above. A module called in a loop has many calls of one name in a step; each child
    stretches only the call it ran in. Then the deepest calls stretch their parents first, so a
    stretch carries up to the model. O(n log n): a sort per name, a bisection per child."""
    by_name: Dict[Tuple[str, str], _Calls] = {}
    for call in calls:
        by_name.setdefault((str(call.row[3]), str(call.row[5])), _Calls()).calls.append(call)
    for calls_of_name in by_name.values():
        calls_of_name.index()
    matched: List[Tuple[Call, Call]] = []
    for call in calls:
        parents = by_name.get((call.parent, str(call.row[5]))) if call.parent else None
        parent = parents.parent_of(call) if parents is not None else None
        if parent is not None:
            matched.append((call, parent))
    matched.sort(key=lambda pair: -pair[0].depth)
    for call, parent in matched:
        parent.start = min(parent.start, call.start)
        parent.end = max(parent.end, call.end)


class _Calls:
    """The calls of one module in one stage of a step, by measured start, to find a child's parent."""

    __slots__ = ("calls", "starts", "ends", "outer")

    def __init__(self) -> None:
        self.calls: List[Call] = []
        self.starts: List[int] = []
        self.ends: List[int] = []
        self.outer: List[int] = []  # the index of the innermost earlier call containing each, or -1

    def index(self) -> None:
        self.calls.sort(key=lambda call: (call.start, -call.end))
        self.starts = [call.start for call in self.calls]
        self.ends = [call.end for call in self.calls]
        open_calls: List[int] = []  # calls of this name nest (recursion) or follow each other
        for position, (start, end) in enumerate(zip(self.starts, self.ends)):
            while open_calls and not (start < self.ends[open_calls[-1]] and end <= self.ends[open_calls[-1]]):
                open_calls.pop()
            self.outer.append(open_calls[-1] if open_calls else -1)
            open_calls.append(position)

    def _containing(self, position: int, start: int, end: int) -> Optional[Call]:
        """The innermost call at `position` or around it that contains [start, end]."""
        for _ in range(MAX_NESTED_CALLS):
            if position < 0:
                return None
            if self.starts[position] <= start and end <= self.ends[position]:
                return self.calls[position]
            position = self.outer[position]
        return None

    def parent_of(self, child: Call) -> Optional[Call]:
        before = bisect.bisect_right(self.starts, child.start) - 1
        found = self._containing(before, child.start, child.end)
        if found is not None:
            return found
        # Sticking out by a hook's time: past the end of the call it began in, or starting just
        # before the next call of the name begins.
        if before >= 0 and child.start < self.ends[before] and child.end <= self.ends[before] + NEST_SLACK_US:
            return self.calls[before]
        after = before + 1
        if after < len(self.calls) and self.starts[after] - NEST_SLACK_US <= child.start:
            if child.end <= self.ends[after] + NEST_SLACK_US:
                return self.calls[after]
        if child.row[5] == "backward":
            # A backward child begun before its parent, any amount, ending inside it.
            around = bisect.bisect_left(self.starts, child.end) - 1
            if around >= 0 and self.starts[around] > child.start:
                return self._containing(around, self.starts[around], child.end)
        return None
