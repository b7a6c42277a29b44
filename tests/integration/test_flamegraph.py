"""`probing PID flamegraph`: sampled stacks from the agent or py-spy, the torch module
hierarchy, each format written, and the page drawn in headless Chromium."""

from __future__ import annotations

import json
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from browser import Browser, screenshot_path
from speedscope_schema import check_speedscope

from probing.errors import ExitCode

from support import PROBING, Target, probing, wait_until


def folded(path: Path) -> List[Tuple[List[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        body, _, count = line.rpartition(" ")
        stacks.append((body.split(";"), int(count)))
    return stacks


def leaf_totals(stacks: List[Tuple[List[str], int]]) -> Dict[str, int]:
    totals: Dict[str, int] = {}
    for names, count in stacks:
        leaf = names[-1].split(" (")[0]
        totals[leaf] = totals.get(leaf, 0) + count
    return totals


def test_the_slow_function_dominates_and_every_format_is_written(tmp_path: Path) -> None:
    with Target("slow_and_fast.py", via="plain") as job:
        out = tmp_path / "cpu.folded"
        result = probing(str(job.pid), "flamegraph", "--duration", "2", "-o", str(out))
        assert result.returncode == 0, result.stderr
        assert "from the agent" in result.stderr and "probing: wrote" in result.stderr
        stacks = folded(out)
        worker = [(names, count) for names, count in stacks if names[0] == "worker"]
        totals = leaf_totals(worker)
        assert totals.get("slow_function", 0) > 5 * totals.get("fast_function", 0), totals
        assert max(totals, key=lambda name: totals[name]) == "slow_function"
        assert not any(names[0].startswith("probing-") for names, _ in stacks)
        assert any(names[0] == "MainThread" for names, _ in stacks)
        for name in ("cpu.svg", "cpu.speedscope.json"):
            path = tmp_path / name
            assert probing(str(job.pid), "flamegraph", "--duration", "1", "-o", str(path)).returncode == 0
        ElementTree.parse(tmp_path / "cpu.svg")
        speedscope = json.loads((tmp_path / "cpu.speedscope.json").read_text())
        check_speedscope(speedscope)  # speedscope's own schema, and frame indexes in range
        assert speedscope["profiles"]
        assert job.alive()


def test_outside_samples_with_py_spy_and_sees_the_same_slow_function(tmp_path: Path) -> None:
    with Target("slow_and_fast.py", via="plain") as job:
        out = tmp_path / "cpu.folded"
        result = probing(str(job.pid), "flamegraph", "--outside", "--duration", "2", "-o", str(out))
        assert result.returncode == 0, result.stderr
        assert "asked for with --outside; sampled from outside the process (py-spy record)" in result.stderr
        worker = [
            (names, count) for names, count in folded(out) if any(n.startswith("work (") for n in names)
        ]
        totals = leaf_totals(worker)
        assert max(totals, key=lambda name: totals[name]) == "slow_function", totals
        assert job.alive()
        both = probing(str(job.pid), "flamegraph", "--outside", "--torch", "-o", str(tmp_path / "m.html"))
        assert both.returncode == ExitCode.USAGE


def test_a_second_sampling_is_refused_and_a_record_is_not_live(tmp_path: Path) -> None:
    # A job at rest: one with a thread that computes in Python (slow_and_fast.py) holds the GIL
    # whenever py-spy looks, so on a loaded machine an agent slower than the early look (0.3 s)
    # gets the sampling taken from outside, and nothing in the agent to refuse a second one.
    with Target("sleeper.py", via="run") as job:
        # Long enough that a loaded machine still finds it sampling; its stderr says why if not.
        command = [PROBING, str(job.pid), "flamegraph", "--duration", "10", "-o", str(tmp_path / "a.folded")]
        first = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        sampling = False
        try:
            # Once the first samples, a second is refused, not queued.
            sampling = wait_until(lambda: probing(str(job.pid), "eval", SAMPLING).stdout == "True\n", 20, 0.2)
            if sampling:
                b_folded = str(tmp_path / "b.folded")
                second = probing(str(job.pid), "flamegraph", "--duration", "1", "-o", b_folded)
        finally:
            if first.poll() is None and not sampling:
                first.kill()
            try:
                _, first_stderr = first.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                first.kill()
                raise
        assert sampling, f"the first flame graph never sampled in the agent: {first_stderr}"
        assert first.returncode == 0, first_stderr
        assert second.returncode != 0 and "another flame graph is being sampled" in second.stderr
        assert (tmp_path / "a.folded").exists() and not (tmp_path / "b.folded").exists()
        usage = probing(str(job.pid), "flamegraph", "-o", str(tmp_path / "x.png"))
        assert usage.returncode == ExitCode.USAGE and "cannot tell the format" in usage.stderr


def test_a_thread_holding_the_gil_is_sampled_from_outside(tmp_path: Path) -> None:
    with Target("gil_holder.py", via="run") as job:
        out = tmp_path / "gil.svg"
        result = probing(str(job.pid), "flamegraph", "--duration", "1", "-o", str(out))
        assert result.returncode == 0, result.stderr
        assert "sampled from outside the process (py-spy record)" in result.stderr
        assert "holds the GIL" in result.stderr
        text = out.read_text()
        ElementTree.fromstring(text)
        assert "hold_the_gil_forever" in text and "sampled from outside with py-spy" in text
        assert job.alive()


SAMPLING = (
    "import sys; sampler = sys.modules.get('probing.agent.stack_sampler'); "
    "print(sampler is not None and sampler._busy.locked())"
)


def test_a_client_that_leaves_mid_sampling_stops_the_sampler(tmp_path: Path) -> None:
    with Target("sleeper.py", via="run") as job:  # at rest: sampled by the agent, as above
        command = [PROBING, str(job.pid), "flamegraph", "--duration", "60", "-o", str(tmp_path / "x.folded")]
        client = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        try:
            assert wait_until(lambda: probing(str(job.pid), "eval", SAMPLING).stdout == "True\n", 20, 0.2)
        finally:
            client.kill()
            client.wait()
        # The sampler looks for its client every quarter of a second.
        assert wait_until(lambda: probing(str(job.pid), "eval", SAMPLING).stdout == "False\n", 5, 0.1)
        assert not (tmp_path / "x.folded").exists()
        assert job.alive()


DRAWN_FRAMES_JS = """Array.from(document.querySelectorAll('#chart g.frame')).map(function (g) {
  var rect = g.querySelector('rect'), label = g.querySelector('.d3-flame-graph-label');
  return {name: g.getAttribute('name') || '', width: rect ? parseFloat(rect.getAttribute('width')) : 0,
          label: label ? label.textContent : ''};
})"""

SEARCH_JS = """(function (term) {
  var box = document.getElementById('search');
  box.value = term;
  box.dispatchEvent(new Event('input'));
  return new Promise(function (resolve) {  // the redraw lands on the next frame
    requestAnimationFrame(function () { setTimeout(function () {
      resolve(Array.from(document.querySelectorAll('#chart g.frame rect')).filter(function (rect) {
        return (rect.getAttribute('fill') || rect.style.fill || '').toUpperCase() === '#E600E6'
          || rect.style.fill === 'rgb(230, 0, 230)';
      }).length);
    }, 50); });
  });
})(%s)"""


@pytest.mark.pictures
def test_the_page_draws_in_chromium(tmp_path: Path) -> None:
    with Target("slow_and_fast.py", via="plain") as job:
        out = tmp_path / "cpu.html"
        result = probing(str(job.pid), "flamegraph", "--duration", "2", "-o", str(out))
        assert result.returncode == 0, result.stderr
    with Browser() as browser:
        page = browser.open(out)
        assert page.problems() == []
        svgs = page.marks()["svgs"]
        assert svgs and max(svg["marks"] for svg in svgs) > 5, svgs
        # What was drawn, not the data in the page: the frames' rects and their labels.
        frames = page.evaluate(DRAWN_FRAMES_JS)
        widths: Dict[str, float] = {}
        for frame in frames:
            leaf = frame["name"].split(" (")[0]
            widths[leaf] = max(widths.get(leaf, 0.0), frame["width"])
        assert widths.get("slow_function", 0) > 5 * widths.get("fast_function", 0), widths
        labels = [frame["label"] for frame in frames if frame["name"].startswith("slow_function (")]
        assert labels and all(label.startswith("slow_function (") for label in labels), labels
        page.screenshot(screenshot_path(tmp_path, "flamegraph.png"))
        # Typing a frame name ("(" and all) in the search box highlights, no error.
        for term in ("(", "slow_function (slow"):
            found = page.evaluate(SEARCH_JS % json.dumps(term))
            assert found > 0, term
            assert page.problems() == [], term


def test_a_job_that_exits_mid_sampling_gets_a_clear_error(tmp_path: Path) -> None:
    with Target("exits_while_sampled.py", via="run") as job:
        started = time.monotonic()
        result = probing(str(job.pid), "flamegraph", "--duration", "20", "-o", str(tmp_path / "x.svg"))
        assert time.monotonic() - started < 15
        assert result.returncode == ExitCode.NO_SUCH_PROCESS, result.stderr
        assert f"PID {job.pid} exited while its stacks were sampled" in result.stderr
        assert not (tmp_path / "x.svg").exists()


def test_standard_output_and_a_job_without_torch(tmp_path: Path) -> None:
    with Target("sleeper.py", via="run") as job:
        result = probing(str(job.pid), "flamegraph", "--duration", "0.5", "-o", "-", "--format", "folded")
        assert result.returncode == 0, result.stderr
        assert "main_loop (sleeper.py:" in result.stdout and "probing: wrote" not in result.stderr
        no_torch = probing(str(job.pid), "flamegraph", "--torch", "-o", str(tmp_path / "m.html"))
        assert no_torch.returncode == ExitCode.NO_TORCH and "has not imported torch" in no_torch.stderr
