"""`trace off`, then `trace on` again (issue 26): the report counted the untraced gap as one step
("slowest 9.66 s", a spike in the chart), and the `--torch` flame graph took its mean over both
sessions ("mean of 1 074 steps (steps 1-1105)"). Steps are only steps while tracing was on; the
steps each switch cut are none either."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Dict, List

from support import Target, probing, wait_until

STEPS_EACH_SESSION = 8
# Untraced steps the job takes between the sessions: the gap is ~150 of its steps long, so a step
# time taken across it stands out from every real one, and from one real step a loaded machine
# stalled (CI once saw a 150 ms step of 8 ms ones, as `trace on` searched the heap, against a
# 50-step gap of 0.41 s).
UNTRACED_STEPS = 150
# And at least this long: a loaded CI box once stalled one real step 410 ms, against a gap of
# 150 steps that lasted 1.2 s. A step taken across the gap is as long as the gap.
UNTRACED_S = 4.0


def traced_step(pid: int) -> int:
    result = probing(str(pid), "trace", "status", "--format", "json")
    assert result.returncode == 0, result.stderr
    step: int = json.loads(result.stdout)["step"]
    return step


def losses(job: Target) -> int:
    return sum(1 for line in job.stdout_lines if line.startswith("loss "))


def report_data(page: Path) -> Dict[str, Any]:
    found = re.search(r'<script[^>]*id="report-data"[^>]*>(.*?)</script>', page.read_text(), re.S)
    assert found is not None
    data: Dict[str, Any] = json.loads(found.group(1))
    return data


def test_the_report_and_the_module_flame_graph_count_steps_only_while_tracing_was_on(tmp_path: Path) -> None:
    with Target("torch_job.py", via="env", args=["--print-losses"]) as job:
        assert probing(str(job.pid), "trace", "on", "--every", "1").returncode == 0
        first = traced_step(job.pid)
        assert wait_until(lambda: traced_step(job.pid) >= first + STEPS_EACH_SESSION, 60, 0.1)
        switched_off = probing(str(job.pid), "trace", "off", "--format", "json")
        assert switched_off.returncode == 0, switched_off.stderr
        off_at, stepped = time.monotonic(), losses(job)
        cut = json.loads(switched_off.stdout)["step"]  # under way when tracing stopped: it counts no more
        # Tracing off: the job goes on stepping (it says so on stdout), untraced.
        assert wait_until(lambda: losses(job) >= stepped + UNTRACED_STEPS, 60, 0.05)
        time.sleep(max(0.0, off_at + UNTRACED_S - time.monotonic()))
        gap = time.monotonic() - off_at
        assert probing(str(job.pid), "trace", "on", "--every", "1").returncode == 0
        resumed = traced_step(job.pid)
        assert wait_until(lambda: traced_step(job.pid) >= resumed + STEPS_EACH_SESSION, 60, 0.1)

        page = tmp_path / "report.html"
        result = probing(str(job.pid), "report", "-o", str(page), "--hang-duration", "0")
        assert result.returncode == 0, result.stderr
        steps: List[Dict[str, Any]] = report_data(page)["steps"]
        times = sorted(step["seconds"] for step in steps if step["seconds"] is not None)
        median = times[len(times) // 2]
        assert len(times) >= 2 * STEPS_EACH_SESSION - 4, steps
        assert times[-1] < gap / 3 and times[-1] < 50 * median, (gap, steps)
        # The step `trace off` cut is no step (nor is one `trace on` began in the middle of, when
        # it did: its rows are marked); the steps of both sessions are.
        shown = [step["step"] for step in steps]
        assert cut not in shown and cut - 1 in shown and resumed + 1 in shown, (cut, resumed, shown)

        flame = probing(str(job.pid), "flamegraph", "--torch", "-o", str(tmp_path / "modules.folded"))
        assert flame.returncode == 0, flame.stderr
        drawn = re.search(r"mean of ([0-9]+) steps? \(steps ([0-9]+)-([0-9]+)\)", flame.stdout + flame.stderr)
        assert drawn is not None, flame.stdout + flame.stderr
        assert int(drawn.group(2)) > cut, drawn.group(0)  # the newest session's whole steps only
        assert "tracing session 2 only" in flame.stdout + flame.stderr
