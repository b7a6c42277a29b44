"""The interactive flame graph: one self-contained page, d3-flame-graph over d3 (vendored,
inline), the tree as JSON data the page parses. Click a frame to zoom, search by name, reset.
"""

from __future__ import annotations

from typing import Iterator, List

from .flame import Stacks, merged_tree, tree_json
from .page import data_script, document, library_script, text

STYLE = """<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 20px; color: #222; }
h1 { font-size: 17px; font-weight: 600; margin: 0 0 6px; word-break: break-all; }
.figures { color: #555; font-size: 13px; margin: 0 0 6px; }
.note { color: #a30; font-size: 13px; margin: 2px 0; }
.controls { margin: 10px 0; font-size: 13px; }
.controls input { width: 260px; padding: 3px 6px; }
.controls button { padding: 3px 10px; margin-left: 4px; }
#details { color: #333; font-size: 13px; min-height: 18px; margin: 6px 0; word-break: break-all; }
#chart { width: 100%; }
.d3-flame-graph rect { stroke: #eee; fill-opacity: .85; }
.d3-flame-graph rect:hover { stroke: #474747; stroke-width: .5; cursor: pointer; }
.d3-flame-graph-label { pointer-events: none; white-space: nowrap; text-overflow: ellipsis;
  overflow: hidden; font-size: 12px; font-family: Verdana, sans-serif; margin-left: 4px;
  margin-right: 4px; line-height: 1.5; padding: 0; font-weight: 400; color: black; text-align: left; }
.d3-flame-graph .fade { opacity: .6 !important; }
.d3-flame-graph .title { font-size: 20px; font-family: Verdana, sans-serif; }
</style>"""

SCRIPT = """<script>
(function () {
  var data = JSON.parse(document.getElementById("flame-data").textContent);
  var unit = data.unit;
  function amount(value) {
    if (unit === "seconds") {
      return value >= 1 ? value.toFixed(3) + " s" : (value * 1000).toFixed(3) + " ms";
    }
    return Math.round(value).toLocaleString() + (Math.round(value) === 1 ? " sample" : " samples");
  }
  var total = data.tree.value || 1;
  var width = Math.max(600, document.getElementById("chart").clientWidth || 1000);
  var chart = flamegraph.default()
    .width(width)
    .cellHeight(18)
    .transitionDuration(0)
    .minFrameSize(2)
    .sort(false)
    .selfValue(false)
    .setDetailsElement(document.getElementById("details"));
  chart.label(function (d) {
    return d.data.name + " (" + amount(d.data.value) + ", " + (100 * d.data.value / total).toFixed(2) + "%)";
  });
  // A plain substring match: the library's default makes a RegExp of what is typed, and every
  // frame name holds "(file:line)", an unterminated group.
  chart.setSearchMatch(function (d, term) {
    var name = d.data && d.data.name;
    return Boolean(term) && typeof name === "string" && name.indexOf(term) >= 0;
  });
  d3.select("#chart").datum(data.tree).call(chart);
  var search = document.getElementById("search");
  search.addEventListener("input", function () {
    if (search.value) { chart.search(search.value); } else { chart.clear(); }
  });
  document.getElementById("reset").addEventListener("click", function () {
    search.value = ""; chart.clear(); chart.resetZoom();
  });
})();
</script>"""


def html_parts(stacks: Stacks, title: str, unit: str, notes: List[str], figures: str) -> Iterator[str]:
    """The page, in parts (for write_output). `figures`: one line of what was measured."""
    tree = tree_json(merged_tree(stacks, "all"))
    said = "".join(f'<p class="note">{text(note)}</p>' for note in notes)
    body = (
        f"<h1>{text(title)}</h1>\n"
        f'<p class="figures">{text(figures)}</p>\n{said}\n'
        '<div class="controls"><input id="search" type="search" placeholder="Search frames">'
        '<button id="reset" type="button">Reset zoom</button></div>\n'
        '<div id="chart"></div>\n<div id="details"></div>\n'
        + data_script("flame-data", {"tree": tree, "unit": unit})
        + "\n"
        + SCRIPT
    )
    head = STYLE + "\n" + library_script("d3") + "\n" + library_script("flamegraph")
    yield document(title, head, body)
