"""A static SVG flame graph, drawn the way flamegraph.pl draws one: the root at the bottom,
each frame a rectangle as wide as its share of the weight, warm colours by name, a <title>
tooltip on every frame, its name written in it where it fits. No kept Python library draws
SVG flame graphs (flamegraph.pl is Perl, inferno Rust), so this is hand-written glue.

Every name the job chose is escaped as XML text; characters XML 1.0 cannot hold at all (most
control characters) become U+FFFD. Frames narrower than MIN_WIDTH_PX are left out, as
flamegraph.pl's --minwidth does: they could not be seen, and they bound the file's size.
"""

from __future__ import annotations

import re
import zlib
from typing import Iterator, List, Tuple
from xml.sax.saxutils import escape, quoteattr

from .flame import Node, Stacks, describe_weight, merged_tree

WIDTH_PX = 1200
FRAME_HEIGHT_PX = 16
PAD_TOP_PX = 48
PAD_BOTTOM_PX = 24
SIDE_PX = 10
MIN_WIDTH_PX = 0.1
FONT_PX = 12
CHAR_PX = FONT_PX * 0.59  # the average width of a character of the font, as flamegraph.pl takes it

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(value: str) -> str:
    return escape(_NOT_XML.sub("\ufffd", value))


def xml_attribute(value: str) -> str:
    return quoteattr(_NOT_XML.sub("\ufffd", value))


def frame_colour(name: str) -> str:
    """flamegraph.pl's "hot" palette, fixed by the name: the same frame has the same colour in
    every picture."""
    seed = zlib.crc32(name.encode("utf-8", "replace"))
    red = 205 + seed % 50
    green = (seed >> 8) % 230
    blue = (seed >> 16) % 55
    return f"rgb({red},{green},{blue})"


def fitted_label(name: str, width: float) -> str:
    """As much of `name` as fits `width` pixels, with `..` when cut; empty when not even 3
    characters fit."""
    fits = int((width - 6) / CHAR_PX)
    if fits < 3:
        return ""
    return name if len(name) <= fits else name[: fits - 2] + ".."


def _placed(root: Node) -> Iterator[Tuple[Node, float, int]]:
    """Each frame with its left edge (in weight units from the left) and depth (root 0)."""
    pending: List[Tuple[Node, float, int]] = [(root, 0.0, 0)]
    while pending:
        node, left, depth = pending.pop()
        yield node, left, depth
        at = left
        for child in node.children.values():
            pending.append((child, at, depth + 1))
            at += child.value


def svg_parts(stacks: Stacks, title: str, unit: str, notes: List[str]) -> Iterator[str]:
    """The SVG document, in parts (for write_output)."""
    root = merged_tree(stacks, "all")
    total = root.value or 1.0
    scale = (WIDTH_PX - 2 * SIDE_PX) / total
    visible = [
        (node, left, depth) for node, left, depth in _placed(root) if node.value * scale >= MIN_WIDTH_PX
    ]
    depth_max = max((depth for _, _, depth in visible), default=0)
    height = PAD_TOP_PX + (depth_max + 1) * FRAME_HEIGHT_PX + PAD_BOTTOM_PX
    yield (
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n'
        f'<svg version="1.1" xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}" '
        f'viewBox="0 0 {WIDTH_PX} {height}" font-family="Verdana, sans-serif" font-size="{FONT_PX}">\n'
        f"<title>{xml_text(title)}</title>\n"
        f'<rect x="0" y="0" width="{WIDTH_PX}" height="{height}" fill="#fdfdf6"/>\n'
        f'<text x="{WIDTH_PX / 2:.0f}" y="20" text-anchor="middle" font-size="15">{xml_text(title)}</text>\n'
    )
    if notes:
        said = " | ".join(notes)
        yield f'<text x="{SIDE_PX}" y="38" font-size="11" fill="#a00">{xml_text(said[:400])}</text>\n'
    yield '<g id="frames">\n'
    for node, left, depth in visible:
        x = SIDE_PX + left * scale
        width = node.value * scale
        y = height - PAD_BOTTOM_PX - (depth + 1) * FRAME_HEIGHT_PX
        share = 100.0 * node.value / total
        tip = f"{node.name} ({describe_weight(node.value, unit)}, {share:.2f}%)"
        fill = "rgb(220,220,220)" if depth == 0 else frame_colour(node.name)
        label = fitted_label(node.name, width)
        text = (
            f'<text x="{x + 3:.2f}" y="{y + FRAME_HEIGHT_PX - 4}">{xml_text(label)}</text>' if label else ""
        )
        yield (
            f"<g><title>{xml_text(tip)}</title>"
            f'<rect x="{x:.2f}" y="{y}" width="{width:.2f}" height="{FRAME_HEIGHT_PX - 1}" fill="{fill}" '
            f'rx="2" ry="2"/>{text}</g>\n'
        )
    yield "</g>\n</svg>\n"
