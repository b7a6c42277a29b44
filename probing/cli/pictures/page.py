"""What every HTML page probing writes is made of: the vendored libraries inline, data as JSON
the page parses (never as code), and a Content-Security-Policy that lets the page load nothing
from anywhere, so it opens the same offline, from a mail attachment or an incident channel."""

from __future__ import annotations

import html
import json
import os
import re
from typing import Any, Dict

from ..render.json_writer import finite, json_default

VENDOR_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor")

# name -> file in vendor/ (versions, licenses and digests: vendor/README.md)
LIBRARIES: Dict[str, str] = {
    "d3": "d3.min.js",
    "flamegraph": "d3-flamegraph.umd.min.js",
    "chart": "chart.umd.min.js",
}

# Inline scripts and styles only; no fetch, image, font or frame from anywhere, not even the
# page's own directory. A library that tried would be refused by the browser, not served.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; connect-src 'none'; form-action 'none'; base-uri 'none'"
)

# A map comment would make a browser's developer tools fetch the .map file beside the page.
_SOURCE_MAP = re.compile(r"\n?//# sourceMappingURL=\S*\s*$")
# Text that would end an inline <script> early, or enter its escaped state.
_SCRIPT_BREAKERS = re.compile(r"</script|<!--", re.IGNORECASE)


def library_script(name: str) -> str:
    """A <script> element holding the vendored library `name` (a key of LIBRARIES)."""
    with open(os.path.join(VENDOR_DIR, LIBRARIES[name]), encoding="utf-8") as handle:
        source = _SOURCE_MAP.sub("", handle.read())
    if _SCRIPT_BREAKERS.search(source):
        # The vendored builds have none (a unit test checks); a new version that had one
        # would need rewriting that can change its meaning, so refuse rather than guess.
        raise ValueError(f"{LIBRARIES[name]} holds text that would end its <script> element")
    return f"<script>{source}</script>"


def data_script(element_id: str, data: Any) -> str:
    """`data` as JSON in a non-executed <script> element, for `JSON.parse(el.textContent)`.

    NaN and Infinity become null (JSON has neither); <, >, & and the two line separators are
    written as \\u escapes, so no string the job chose (a thread name, a module name) can close
    the element or be read as markup.
    """
    text = json.dumps(finite(data), default=json_default, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(raw, escaped)
    return f'<script type="application/json" id="{html.escape(element_id)}">{text}</script>'


def text(value: Any) -> str:
    """`value` as HTML text: whatever the job named it, it stays text."""
    return html.escape(str(value), quote=True)


def document(title: str, head: str, body: str) -> str:
    """A whole page: the policy first, then `head` (styles, libraries) and `body`."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{text(title)}</title>\n{head}\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
