"""Flame graphs as files people already open: folded stacks (flamegraph.pl, inferno, py-spy's
raw), speedscope JSON, and the tree the SVG and HTML pictures draw. Pure: stacks in, text out.

A flame graph's input everywhere here is a list of (names root to leaf, weight): samples for
sampled stacks, seconds for the module hierarchy.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Sequence, Tuple

from ... import __version__
from ..render.json_writer import finite

Stacks = Sequence[Tuple[Sequence[str], float]]

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def folded_name(name: str) -> str:
    """A name as one field of a folded line: `;` separates frames and a line ends a stack, so
    both are replaced (the job names threads and files as it likes)."""
    return name.replace(";", ":").replace("\r", " ").replace("\n", " ")


def _weight_text(weight: float) -> str:
    if float(weight).is_integer():
        return str(int(weight))
    return f"{weight:.9f}".rstrip("0").rstrip(".")


def folded_lines(stacks: Stacks) -> Iterator[str]:
    """`a;b;c WEIGHT` per stack, heaviest first (seconds keep nine decimals: nanoseconds)."""
    for names, weight in sorted(stacks, key=lambda stack: -stack[1]):
        if weight > 0 and names:
            yield ";".join(folded_name(name) for name in names) + f" {_weight_text(weight)}\n"


def total_weight(stacks: Stacks) -> float:
    return float(sum(weight for _, weight in stacks if weight > 0))


class Node:
    """One frame of the merged tree: its name, its total weight (children included), and its
    children by name in first-seen order."""

    __slots__ = ("name", "value", "children")

    def __init__(self, name: str) -> None:
        self.name = name
        self.value = 0.0
        self.children: Dict[str, Node] = {}

    def self_value(self) -> float:
        return max(0.0, self.value - sum(child.value for child in self.children.values()))


def merged_tree(stacks: Stacks, root_name: str = "all") -> Node:
    """The stacks merged into one tree under `root_name`, heaviest children first."""
    root = Node(root_name)
    for names, weight in stacks:
        if weight <= 0:
            continue
        root.value += weight
        node = root
        for name in names:
            child = node.children.get(name)
            if child is None:
                child = node.children[name] = Node(name)
            child.value += weight
            node = child
    _sort(root)
    return root


def _sort(node: Node) -> None:
    pending = [node]
    while pending:  # not recursive: a stack may be deeper than Python's recursion limit
        current = pending.pop()
        current.children = dict(sorted(current.children.items(), key=lambda item: -item[1].value))
        pending.extend(current.children.values())


def tree_json(root: Node) -> Dict[str, Any]:
    """d3-flame-graph's data, built without recursion."""
    out: Dict[str, Any] = {"name": root.name, "value": finite(root.value), "children": []}
    pending: List[Tuple[Node, Dict[str, Any]]] = [(root, out)]
    while pending:
        node, shape = pending.pop()
        for child in node.children.values():
            child_shape: Dict[str, Any] = {"name": child.name, "value": finite(child.value), "children": []}
            shape["children"].append(child_shape)
            pending.append((child, child_shape))
    return out


def speedscope_document(stacks: Stacks, title: str, unit: str) -> Dict[str, Any]:
    """A speedscope file (SPEEDSCOPE_SCHEMA): one sampled profile per first name (per thread
    for sampled stacks, per stage for modules), frames shared, weights in `unit`."""
    frames: List[Dict[str, Any]] = []
    index: Dict[str, int] = {}
    profiles: Dict[str, Dict[str, Any]] = {}
    for names, weight in stacks:
        if weight <= 0 or not names:
            continue
        group, path = names[0], names[1:] or names[:1]
        profile = profiles.get(group)
        if profile is None:
            profile = profiles[group] = {
                "type": "sampled", "name": group, "unit": "seconds" if unit == "seconds" else "none",
                "startValue": 0, "endValue": 0, "samples": [], "weights": [],
            }  # fmt: skip
        sample = []
        for name in path:
            at = index.get(name)
            if at is None:
                at = index[name] = len(frames)
                frames.append({"name": name})
            sample.append(at)
        profile["samples"].append(sample)
        profile["weights"].append(finite(weight))
        profile["endValue"] += weight
    ordered = sorted(profiles.values(), key=lambda profile: -profile["endValue"])
    for profile in ordered:
        profile["endValue"] = finite(profile["endValue"])
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "shared": {"frames": frames},
        "profiles": ordered,
        "name": title,
        "activeProfileIndex": 0,
        "exporter": f"probing {__version__}",
    }


def speedscope_text(stacks: Stacks, title: str, unit: str) -> str:
    return (
        json.dumps(speedscope_document(stacks, title, unit), ensure_ascii=False, separators=(",", ":")) + "\n"
    )


def describe_weight(value: float, unit: str) -> str:
    """How a frame's weight reads in a tooltip: `12 samples` or `3.45 ms`."""
    if unit == "seconds":
        if value >= 1:
            return f"{value:.3f} s"
        return f"{value * 1000:.3f} ms"
    count = int(round(value))
    return f"{count:,} sample{'' if count == 1 else 's'}"
