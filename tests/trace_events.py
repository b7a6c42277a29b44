"""Checks of a Chrome trace event file against the format's rules (the Trace Event Format
document: JSON Object Format, and the Complete, Instant, Counter and Metadata events), and of the
nesting a viewer needs; shared by the unit and integration tests of `trace export`."""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

# The phases `trace export` writes, and the fields each must carry.
REQUIRED = {
    "X": ("name", "ph", "ts", "dur", "pid", "tid"),
    "i": ("name", "ph", "ts", "s", "pid", "tid"),
    "C": ("name", "ph", "ts", "pid", "args"),
    "M": ("name", "ph", "pid", "args"),
}
METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load_trace(text: str) -> Dict[str, Any]:
    """The document, checked: every rule it breaks fails the assertion with the event."""
    document = json.loads(text)  # strict: NaN or Infinity would not parse in a browser either
    assert isinstance(document, dict) and isinstance(document.get("traceEvents"), list)
    assert document.get("displayTimeUnit", "ms") in ("ms", "ns")
    named_processes, named_threads = set(), set()
    used_threads = set()
    for event in document["traceEvents"]:
        assert isinstance(event, dict), event
        phase = event.get("ph")
        assert phase in REQUIRED, event
        for field in REQUIRED[phase]:
            assert field in event, (field, event)
        assert isinstance(event["name"], str), event
        assert _integer(event["pid"]), event
        if "tid" in event:
            assert _integer(event["tid"]), event
        if "args" in event:
            assert isinstance(event["args"], dict), event
        if phase != "M":
            assert _number(event["ts"]) and event["ts"] >= 0, event
        if phase == "X":
            assert _number(event["dur"]) and event["dur"] >= 0, event
            used_threads.add((event["pid"], event["tid"]))
        elif phase == "i":
            assert event["s"] in ("g", "p", "t"), event
            used_threads.add((event["pid"], event["tid"]))
        elif phase == "C":
            assert event["args"] and all(_number(value) for value in event["args"].values()), event
        elif phase == "M":
            assert event["name"] in METADATA, event
            if event["name"].endswith("_name"):
                assert isinstance(event["args"].get("name"), str), event
            if event["name"].endswith("_sort_index"):
                assert _integer(event["args"].get("sort_index")), event
            if event["name"] == "process_name":
                named_processes.add(event["pid"])
            if event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
    assert used_threads <= named_threads, used_threads - named_threads
    assert {pid for pid, _ in used_threads} <= named_processes
    return document


def spans(document: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [event for event in document["traceEvents"] if event["ph"] == "X"]


def check_tracks_nest(document: Dict[str, Any]) -> None:
    """On each (pid, tid), two X events are nested or apart, never partly overlapping."""
    tracks: Dict[Tuple[int, int], List[Tuple[int, int]]] = defaultdict(list)
    for event in spans(document):
        tracks[(event["pid"], event["tid"])].append((event["ts"], event["ts"] + event["dur"]))
    for track, intervals in tracks.items():
        stack: List[Tuple[int, int]] = []
        for start, end in sorted(intervals, key=lambda pair: (pair[0], -pair[1])):
            while stack and stack[-1][1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1][1], (track, stack[-1], (start, end))
            stack.append((start, end))


def _inside(inner: Dict[str, Any], outer: Dict[str, Any]) -> bool:
    return bool(outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"])


class _Around:
    """The spans of one name sorted by start, each with the innermost earlier one around it."""

    def __init__(self, events: List[Dict[str, Any]]) -> None:
        self.events = sorted(events, key=lambda event: (event["ts"], -event["dur"]))
        self.starts = [event["ts"] for event in self.events]
        self.outer: List[int] = []
        open_spans: List[int] = []
        for position, event in enumerate(self.events):
            while open_spans and not _inside(event, self.events[open_spans[-1]]):
                open_spans.pop()
            self.outer.append(open_spans[-1] if open_spans else -1)
            open_spans.append(position)


def _innermost_around(call: Dict[str, Any], around: _Around) -> Optional[Dict[str, Any]]:
    """The innermost span of `around` that contains `call` (bisection, then outwards)."""
    position = bisect.bisect_right(around.starts, call["ts"]) - 1
    while position >= 0:
        if _inside(call, around.events[position]):
            return around.events[position]
        position = around.outer[position]
    inside = [event for event in around.events if _inside(call, event)]  # spans partly overlapping
    return min(inside, key=lambda event: (event["dur"], -event["ts"])) if inside else None


def check_hierarchy(document: Dict[str, Any]) -> None:
    """Every call lies inside its step's span, and every call of model.a.b inside its real parent:
    the innermost call of model.a (same step and stage) around it, when model.a was traced. A
    parent drawn longer than it measured (args.duration_s) must owe it to its own children: its
    drawn start is its earliest child's or its drawn end its latest child's. (A parent stretched
    over calls that ran in another call of its name, or over nothing, fails.)"""
    steps = {
        (event["pid"], event["args"]["step"]): event for event in spans(document) if event["cat"] == "step"
    }
    calls = [event for event in spans(document) if event["cat"] != "step"]
    named: Dict[Tuple[int, int, str, str], List[Dict[str, Any]]] = defaultdict(list)
    for call in calls:
        args = call["args"]
        named[(call["pid"], args["step"], args["stage"], args["module"])].append(call)
    by_name = {key: _Around(events) for key, events in named.items()}
    children: Dict[int, List[Dict[str, Any]]] = defaultdict(list)
    for call in calls:
        args = call["args"]
        assert _inside(call, steps[(call["pid"], args["step"])]), call
        parent = args["module"].rpartition(".")[0]
        parents = by_name.get((call["pid"], args["step"], args["stage"], parent))
        if parent and parents:
            real = _innermost_around(call, parents)
            assert real is not None, (call, parents.events[:10])
            children[id(real)].append(call)
    for call in calls:
        measured = round(call["args"]["duration_s"] * 1_000_000)
        if call["dur"] <= measured + 1:
            continue
        own = children.get(id(call), [])
        assert own, ("stretched over no child of its own", call)
        first = min(child["ts"] for child in own)
        last = max(child["ts"] + child["dur"] for child in own)
        assert call["ts"] == first or call["ts"] + call["dur"] == last, (
            "stretched past its children",
            call,
            own,
        )
