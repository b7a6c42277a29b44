"""Checks of a Chrome trace event file against the format's rules (the Trace Event Format
document: JSON Object Format, and the Complete, Instant, Counter and Metadata events), and of the
nesting a viewer needs; shared by the unit and integration tests of `trace export`."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Dict, List, Tuple

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


def check_hierarchy(document: Dict[str, Any]) -> None:
    """Every call lies inside its step's span, and every call of model.a.b inside a call of
    model.a of the same step and stage (when model.a was traced)."""
    steps = {
        (event["pid"], event["args"]["step"]): event for event in spans(document) if event["cat"] == "step"
    }
    calls = [event for event in spans(document) if event["cat"] != "step"]
    by_name: Dict[Tuple[int, int, str, str], List[Dict[str, Any]]] = defaultdict(list)
    for call in calls:
        args = call["args"]
        by_name[(call["pid"], args["step"], args["stage"], args["module"])].append(call)
    for call in calls:
        args = call["args"]
        assert _inside(call, steps[(call["pid"], args["step"])]), call
        parent = args["module"].rpartition(".")[0]
        parents = by_name.get((call["pid"], args["step"], args["stage"], parent))
        if parent and parents:
            assert any(_inside(call, candidate) for candidate in parents), (call, parents)
