"""The flame graph writers: folded text, speedscope JSON, SVG and the page, from stacks."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from typing import List, Sequence, Tuple

import pytest
from speedscope_schema import check_speedscope

from probing.cli.flamegraph import format_of
from probing.cli.pictures.flame import SPEEDSCOPE_SCHEMA, folded_lines, merged_tree, speedscope_document
from probing.cli.pictures.flame_html import html_parts
from probing.cli.pictures.flame_svg import svg_parts

STACKS: List[Tuple[Sequence[str], float]] = [
    (("MainThread", "main (a.py:1)", "slow (a.py:5)"), 90.0),
    (("MainThread", "main (a.py:1)", "fast (a.py:9)"), 10.0),
    (("worker", "run (b.py:3)"), 50.0),
]
HOSTILE = '<script>alert("x")</script>; & \x00\x07 ]]> \ud800 \u2028'

SVG = "{http://www.w3.org/2000/svg}"


def test_folded_lines_are_one_stack_each_heaviest_first() -> None:
    lines = list(folded_lines(STACKS))
    assert lines[0] == "MainThread;main (a.py:1);slow (a.py:5) 90\n"
    assert len(lines) == 3 and all(line.count("\n") == 1 for line in lines)
    assert list(folded_lines([(("a;b", "c\nd"), 0.25)])) == ["a:b;c d 0.25\n"]


def test_the_tree_sums_children_into_parents() -> None:
    root = merged_tree(STACKS)
    assert root.value == 150
    main = root.children["MainThread"].children["main (a.py:1)"]
    assert main.value == 100 and main.self_value() == 0
    assert list(root.children) == ["MainThread", "worker"]  # heaviest first


def test_speedscope_has_the_schema_one_profile_per_thread_and_valid_indices() -> None:
    document = speedscope_document(STACKS, "t", "samples")
    assert document["$schema"] == SPEEDSCOPE_SCHEMA
    frames = document["shared"]["frames"]
    profiles = {profile["name"]: profile for profile in document["profiles"]}
    assert set(profiles) == {"MainThread", "worker"}
    main = profiles["MainThread"]
    assert main["type"] == "sampled" and main["unit"] == "none" and main["endValue"] == 100
    assert len(main["samples"]) == len(main["weights"]) == 2
    for profile in profiles.values():
        for sample in profile["samples"]:
            assert all(0 <= at < len(frames) for at in sample)
    assert [frames[at]["name"] for at in main["samples"][0]] == ["main (a.py:1)", "slow (a.py:5)"]
    json.dumps(speedscope_document([((HOSTILE, HOSTILE), 1.0)], HOSTILE, "seconds"))


def test_speedscope_files_are_valid_by_speedscopes_own_schema() -> None:
    for document in (
        speedscope_document(STACKS, "t", "samples"),
        speedscope_document(STACKS, "t", "seconds"),
        speedscope_document([((HOSTILE, HOSTILE), 1.0)], HOSTILE, "seconds"),
        speedscope_document([], "empty", "samples"),
    ):
        check_speedscope(json.loads(json.dumps(document)))


def test_the_schema_check_finds_what_speedscope_would_refuse() -> None:
    good = json.loads(json.dumps(speedscope_document(STACKS, "t", "samples")))
    broken = [
        {key: value for key, value in good.items() if key != "shared"},
        {
            **good,
            "profiles": [{**good["profiles"][0], "weights": ["1"] * len(good["profiles"][0]["weights"])}],
        },
        {**good, "profiles": [{**good["profiles"][0], "unit": "furlongs"}]},
        {
            **good,
            "profiles": [
                {**good["profiles"][0], "samples": [[len(good["shared"]["frames"])]], "weights": [1]}
            ],
        },
    ]
    for document in broken:
        with pytest.raises(AssertionError):
            check_speedscope(document)


def _rects(svg_text: str) -> List[Tuple[str, float]]:
    root = ElementTree.fromstring(svg_text.encode("utf-8"))
    found = []
    for group in root.iter(f"{SVG}g"):
        title, rect = group.find(f"{SVG}title"), group.find(f"{SVG}rect")
        if title is not None and rect is not None:
            found.append((title.text or "", float(rect.get("width") or 0)))
    return found


def test_svg_is_well_formed_with_widths_proportional_to_weight() -> None:
    rects = _rects("".join(svg_parts(STACKS, "title", "samples", ["a note"])))
    width = {title.split(" (")[0]: size for title, size in rects}
    assert abs(width["slow"] / width["all"] - 0.6) < 0.01
    assert abs(width["fast"] / width["slow"] - 10 / 90) < 0.01
    assert abs(width["worker"] / width["MainThread"] - 0.5) < 0.01


def test_hostile_names_stay_text_in_svg_and_page() -> None:
    stacks = [((HOSTILE, f"f {HOSTILE}"), 3.0)]
    svg_text = "".join(svg_parts(stacks, HOSTILE, "samples", [HOSTILE]))
    ElementTree.fromstring(svg_text.encode("utf-8"))  # well formed in spite of the name
    assert "<script>" not in svg_text
    page = "".join(html_parts(stacks, HOSTILE, "samples", [HOSTILE], "figures"))
    assert "<script>alert" not in page and "</script>;" not in page
    assert page.count("<script") == 4  # d3, d3-flame-graph, the data, the glue


def test_format_follows_the_extension_or_format() -> None:
    assert format_of("a.HTML", None) == "html"
    assert format_of("a.speedscope.json", None) == "speedscope"
    assert format_of("a.folded", None) == "folded" and format_of("a.txt", None) == "folded"
    assert format_of("a.svg", None) == "svg" and format_of("-", "svg") == "svg"
