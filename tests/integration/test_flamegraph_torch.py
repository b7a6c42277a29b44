"""`probing PID flamegraph --torch`: the module hierarchy of a traced torch job, by mean time per
step; from a record too; a clear error before `trace on`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest
from browser import Browser, screenshot_path

from probing.errors import ExitCode

from support import Target, probing, wait_until


def trace_status(pid: int) -> Dict[str, Any]:
    result = probing(str(pid), "trace", "status", "--format", "json")
    assert result.returncode == 0, result.stderr
    found: Dict[str, Any] = json.loads(result.stdout)
    return found


@pytest.mark.pictures
def test_the_slow_block_is_widest_under_the_model(tmp_path: Path) -> None:
    with Target("torch_job.py", via="plain", args=["--slow"]) as job:
        early = probing(str(job.pid), "flamegraph", "--torch", "-o", str(tmp_path / "none.folded"))
        assert early.returncode != 0 and "trace on" in early.stderr
        assert probing(str(job.pid), "trace", "on", "--backward").returncode == 0
        assert wait_until(lambda: trace_status(job.pid)["step"] >= 6, 60, 0.2)
        out = tmp_path / "modules.folded"
        result = probing(str(job.pid), "flamegraph", "--torch", "-o", str(out))
        assert result.returncode == 0, result.stderr
        weights: Dict[str, float] = {}
        for line in out.read_text().splitlines():
            body, _, weight = line.rpartition(" ")
            weights[body] = float(weight)
        under_model = {
            body: weight for body, weight in weights.items() if body.startswith("forward;model (Sequential);")
        }
        widest = max(under_model, key=lambda body: under_model[body])
        assert widest == "forward;model (Sequential);model.2 (Middle)", under_model
        assert under_model[widest] >= 0.019  # it sleeps 20 ms a step
        assert any(body.startswith("backward;") for body in weights)
        assert any(body.startswith("optimizer;") for body in weights)
        page = tmp_path / "modules.html"
        assert (
            probing(str(job.pid), "flamegraph", "--torch", "--steps", "2:", "-o", str(page)).returncode == 0
        )
        sampled = probing(str(job.pid), "flamegraph", "--torch", "--duration", "1", "-o", str(page))
        assert sampled.returncode == ExitCode.USAGE
    with Browser() as browser:
        opened = browser.open(page)
        assert opened.problems() == []
        assert max(svg["marks"] for svg in opened.marks()["svgs"]) > 5
        assert opened.evaluate("document.body.textContent.includes('model.2 (Middle)')")
        opened.screenshot(screenshot_path(tmp_path, "flamegraph-torch.png"))


def test_from_a_record_and_sampling_a_record_is_not_live(tmp_path: Path) -> None:
    env = {"PROBING_RECORD_DIR": str(tmp_path)}
    with Target("torch_job.py", via="plain", args=["--slow"], env=env) as job:
        assert probing(str(job.pid), "trace", "on").returncode == 0
        assert wait_until(lambda: trace_status(job.pid)["step"] >= 4, 60, 0.2)
        recorded = probing(str(job.pid), "record", "--format", "json")
        assert recorded.returncode == 0, recorded.stderr
    record = json.loads(recorded.stdout)["path"]
    out = tmp_path / "modules.svg"
    result = probing(str(record), "flamegraph", "--torch", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "model.2 (Middle)" in out.read_text()
    live = probing(str(record), "flamegraph", "--duration", "1", "-o", str(tmp_path / "x.svg"))
    assert live.returncode == ExitCode.NOT_LIVE, live.stderr
