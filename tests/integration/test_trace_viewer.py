"""`trace export`'s file opened in a trace viewer that is not ours: speedscope, which imports the
Chrome trace event format, run from its own release files in headless Chromium. Perfetto's UI
is served only from its site and chrome://tracing is gone from Chromium 156, so speedscope is the
viewer that runs offline here (`make browser` unpacks it into .venv/share)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
from browser import Browser, screenshot_path
from test_trace_export import traced  # noqa: F401 - the traced job, a fixture shared with its tests

from tools import SPEEDSCOPE

from support import Target, probing

pytest.importorskip("torch")


@pytest.mark.pictures
@pytest.mark.needs("speedscope", "chromium")
def test_speedscope_draws_the_exported_steps(traced: Target, tmp_path: Path) -> None:  # noqa: F811
    exported = tmp_path / "steps.json"
    result = probing(str(traced.pid), "trace", "export", "--steps", "5:6", "-o", str(exported))
    assert result.returncode == 0, result.stderr
    # What speedscope's own command line does with a file: a script that hands it over.
    loader = tmp_path / "steps.js"
    encoded = base64.b64encode(exported.read_bytes()).decode()
    loader.write_text(f"speedscope.loadFileFromBase64({json.dumps(exported.name)}, {json.dumps(encoded)})")
    with Browser() as browser:
        page = browser.open(
            SPEEDSCOPE / "index.html", fragment=f"localProfilePath={loader}", allow=(SPEEDSCOPE, tmp_path)
        )
        deadline = time.monotonic() + 20
        # The profile's name heads the page once speedscope has read it: the process and the track.
        while "training thread" not in page.evaluate("document.body.innerText"):
            assert time.monotonic() < deadline, page.evaluate("document.body.innerText")
            browser.drain(page, 0.2)
        page.settle()
        assert page.problems() == []
        heading = page.evaluate("document.body.innerText")
        assert f"(pid {traced.pid}), training thread" in heading, heading
        assert any(canvas["painted"] > 10_000 for canvas in page.marks()["canvases"])
        page.screenshot(screenshot_path(tmp_path, "timeline.png"), full_page=False)
