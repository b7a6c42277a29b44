"""`probing PID report --ranks all` on real torchrun jobs (2 ranks, gloo), each page opened in
headless Chromium as test_report.py opens the single report: no console error, no request
leaving the page, every chart drawn. A stalled rank is named behind; a traced job draws a step
line per rank; a frozen rank is named and the others shown (exit 14); a record is refused."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from browser import Browser, Page, screenshot_path
from test_report import HOSTILE, drawn, every_chart_drew, sections, text_of

from probing.cli.pictures.report_job import job_report_page
from probing.engine.jobs.fanout import Missing
from probing.engine.jobs.job import Rank
from probing.engine.report.job import JobReport, fold_ranks, points_per_rank
from probing.errors import AgentTimeout, ExitCode

from support import TorchrunJob, probing, wait_until

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser() as opened:
        yield opened


def job_data(page: Page) -> Dict[str, Any]:
    """The charts' data, as the page's script reads it."""
    found: Dict[str, Any] = page.evaluate("JSON.parse(document.getElementById('job-data').textContent)")
    return found


def column(page: Page, section: str, header: str) -> List[str]:
    """The cells under `header` in the first table of the section that has that column."""
    found: List[str] = page.evaluate(
        f"""(() => {{
          for (const table of document.querySelectorAll('#{section} table')) {{
            const at = [...table.querySelectorAll('thead th')].findIndex(th => th.textContent === {header!r});
            const rows = [...table.querySelectorAll('tbody tr')];
            if (at >= 0) return rows.map(tr => tr.children[at].textContent);
          }}
          return null;
        }})()"""
    )
    assert found is not None, f"no column {header!r} in #{section}"
    return found


@pytest.mark.pictures
def test_a_stalled_rank_is_named_behind_on_the_job_page(browser: Browser, tmp_path: Path) -> None:
    with TorchrunJob("stall", ranks=2, args=["--rank-at", "1", "--step", "2"]) as job:
        output = tmp_path / "job.html"
        result = probing(str(job.agent_pid), "report", "--ranks", "all", "-o", str(output))
        assert result.returncode == ExitCode.OK, result.stderr
        assert f"probing: wrote {output} (" in result.stderr and "2 ranks" in result.stderr
    page = browser.open(output)
    assert page.problems() == []
    shown = sections(page)
    assert shown[0] == "hang" and {"verdict", "ranks", "memory", "threads"} <= set(shown), shown
    assert "missing" not in shown and "steps" not in shown  # nothing traced: no step chart
    assert page.evaluate("document.querySelector('#hang').className") == "banner bad"
    assert column(page, "verdict", "rank")[0] == "1"  # the Behind table's first rank
    assert "load_shard" in page.evaluate("document.querySelector('#behind + .scroll').innerText")
    assert column(page, "ranks", "rank") == ["0", "1"]
    assert column(page, "ranks", "pid") == [str(job.pids[0]), str(job.pids[1])]
    # stalled at step 2: rank 0 has enqueued the all_reduce rank 1 never came to
    collectives = column(page, "ranks", "collective enqueued / completed")
    assert collectives[0].endswith("(default_pg)") and collectives[1].endswith("(default_pg)"), collectives
    assert collectives[0] != collectives[1], collectives
    words = text_of(page)
    assert "trace on --ranks all" in words
    # rank 0 waits in all_reduce, rank 1 in load_shard: their main threads are two entries.
    headings = page.evaluate("[...document.querySelectorAll('.on-ranks')].map(e => e.textContent)")
    assert f"rank 0 (PID {job.pids[0]})" in headings and f"rank 1 (PID {job.pids[1]})" in headings
    assert {"chart-rank-rss"} <= set(drawn(page)) and every_chart_drew(page)


@pytest.mark.pictures
def test_a_rank_holding_the_gil_is_read_from_outside(browser: Browser, tmp_path: Path) -> None:
    """Its stacks from py-spy (said at the top), its row marked so; the others' tables as usual."""
    with TorchrunJob("gil", ranks=2, args=["--rank-at", "1", "--step", "2"]) as job:
        output = tmp_path / "gil.html"
        result = probing(str(job.agent_pid), "report", "--ranks", "all", "--hang-duration", "1",
                         "-o", str(output))  # fmt: skip
        assert result.returncode == ExitCode.OK, result.stderr
    page = browser.open(output)
    assert page.problems() == []
    shown = sections(page)
    assert shown[:2] == ["outside", "hang"] and "missing" not in shown, shown
    assert "rank 1 gave no answer through its agent" in text_of(page)
    states = column(page, "ranks", "state")
    assert "[read from outside]" not in states[0] and "[read from outside]" in states[1], states
    assert {point["rank"] for point in job_data(page)["memory"]} == {0}
    assert every_chart_drew(page)


@pytest.mark.pictures
def test_a_straggler_is_named_on_the_job_page(browser: Browser, tmp_path: Path) -> None:
    with TorchrunJob(script="straggler_job.py", ranks=2, args=["--slow-data", "1:50"]) as job:
        output = tmp_path / "job.html"
        result = probing(str(job.agent_pid), "report", "--ranks", "all", "-o", str(output))
        assert result.returncode == ExitCode.OK, result.stderr
    page = browser.open(output)
    assert page.problems() == []
    shown = sections(page)
    assert shown.index("stragglers") == shown.index("hang") + 1, shown
    said = page.evaluate("document.querySelector('#stragglers').innerText")
    assert "rank 1 is late to " in said and "`probing PID stragglers` says where its time goes" in said
    assert "The other rank: late by " in said
    assert column(page, "stragglers", "rank") == ["1"]


@pytest.mark.pictures
def test_a_traced_job_draws_a_step_line_per_rank_and_a_frozen_rank_is_named(
    browser: Browser, tmp_path: Path
) -> None:
    with TorchrunJob("healthy", ranks=2) as job:
        on = probing(str(job.agent_pid), "trace", "on", "--every", "1", "--ranks", "all")
        assert on.returncode == 0, on.stderr

        def traced_steps(rank: int) -> int:
            found = probing(str(job.pids[rank]), "query", "--format", "json",
                            "SELECT count(DISTINCT step) AS n FROM python.torch_trace")  # fmt: skip
            return int(json.loads(found.stdout)[0]["n"]) if found.returncode == 0 else 0

        assert wait_until(lambda: min(traced_steps(0), traced_steps(1)) >= 4, 120, 0.2)
        output = tmp_path / "job.html"
        result = probing(str(job.agent_pid), "report", "--ranks", "all", "-o", str(output))
        assert result.returncode == ExitCode.OK, result.stderr
        page = browser.open(output)
        assert page.problems() == []
        shown = sections(page)
        assert {"hang", "ranks", "steps", "memory", "threads"} <= set(shown), shown
        assert page.evaluate("document.querySelector('#hang').className") == "banner good"
        data = job_data(page)
        assert {step["rank"] for step in data["steps"]} == {0, 1}
        charts = drawn(page)
        assert len(charts["chart-rank-steps"]) == 2 and every_chart_drew(page), charts
        assert all(int(count) >= 3 for count in column(page, "ranks", "steps traced"))
        # The ranks run the same loop: their main threads' stacks are often one entry.
        page.screenshot(screenshot_path(tmp_path, "report-job.png"))

        os.kill(job.pids[1], signal.SIGSTOP)
        try:
            partial = tmp_path / "partial.html"
            missing = probing(str(job.agent_pid), "report", "--ranks", "all", "--timeout", "3",
                              "--hang-duration", "1", "-o", str(partial))  # fmt: skip
        finally:
            os.kill(job.pids[1], signal.SIGCONT)
        assert missing.returncode == ExitCode.PARTIAL, missing.stderr
        assert f"probing: rank 1 (PID {job.pids[1]}): " in missing.stderr
        assert f"probing: wrote {partial} (" in missing.stderr
    page = browser.open(partial)
    assert page.problems() == []
    shown = sections(page)
    assert shown[0] == "missing" and "ranks" in shown, shown
    assert f"rank 1 (PID {job.pids[1]})" in page.evaluate("document.querySelector('#missing').innerText")
    assert column(page, "ranks", "rank") == ["0"]
    assert {step["rank"] for step in job_data(page)["steps"]} == {0}


def test_a_record_has_no_ranks_to_report(tmp_path: Path) -> None:
    record = tmp_path / "job.probing"  # a record by its name: refused before it is read
    record.write_bytes(b"")
    result = probing(str(record), "report", "--ranks", "all", "-o", str(tmp_path / "x.html"))
    assert result.returncode == ExitCode.NOT_LIVE, result.stderr
    assert "report --ranks needs a live process" in result.stderr
    assert not (tmp_path / "x.html").exists()


def hostile_thread(rank: int) -> Dict[str, Any]:
    frames = [dict(func=HOSTILE, file=f"/{HOSTILE}.py", lineno=7, frame_type="Python", code=HOSTILE)]
    return dict(name=HOSTILE, thread_id=rank, native_id=1000 + rank, is_main=True, daemon=False,
                cpu_s=None, state="sleeping", activity=None, where=HOSTILE, frames=frames)  # fmt: skip


@pytest.mark.pictures
def test_a_page_of_64_ranks_is_bounded_and_names_stay_text(browser: Browser, tmp_path: Path) -> None:
    """The page of the most the SQL lets through for 64 ranks, every name the job chose hostile:
    its size, one stack entry for the 64 identical main threads, no markup run."""
    ranks = [Rank(rank, rank % 8, rank // 8, 5000 + rank) for rank in range(64)]
    steps_each, memory_each = points_per_rank(64)
    threads, left_out = fold_ranks([(rank, [hostile_thread(rank.rank)]) for rank in ranks])
    assert len(threads) == 1 and threads[0]["ranks"] == list(range(64)) and left_out == 0
    steps = [dict(rank=r, step=s, seconds=0.1 + r / 1000, traced_s=0.09)
             for r in range(64) for s in range(steps_each)]  # fmt: skip
    memory = [dict(rank=r, ts=1.7e9 + p, rss_mb=1000.0 + r, cuda_allocated_mb=500.0)
              for r in range(64) for p in range(memory_each)]  # fmt: skip
    rows = [dict(rank=r, local_rank=r % 8, node=r // 8, pid=5000 + r, where=HOSTILE, state=HOSTILE,
                 steps_traced=steps_each, last_step_s=0.1, rss_mb=1000.0)
            for r in range(63)]  # fmt: skip
    job = dict(name=HOSTILE, run_id=HOSTILE, launcher_pid=1, world_size=64, asked=list(range(64)))
    report = JobReport(
        job=job, ranks=rows, missing=[Missing(ranks[63], AgentTimeout(HOSTILE))], verdict=None,
        steps=steps, memory=memory, threads=threads, thread_count=64, threads_left_out=0, outside=[],
        absent={}, notes=[HOSTILE], timings={"total_s": 1.0}, generated_at=1.7e9,
    )  # fmt: skip
    output = tmp_path / "job.html"
    output.write_text(job_report_page(report), encoding="utf-8")
    assert output.stat().st_size < 2_000_000
    page = browser.open(output)
    assert page.problems() == [] and page.evaluate("window.pwned === undefined")
    assert sections(page)[0] == "missing" and page.evaluate("document.querySelectorAll('img').length") == 0
    charts = drawn(page)
    assert len(charts["chart-rank-steps"]) == 64 and every_chart_drew(page), charts
    assert "ranks 0-63 (64 ranks on " in text_of(page)  # counted, not 64 PIDs (per_rank.HEADING_PIDS)
    # The shared entry gives each rank's own ids (eight of them, then a count), not rank 0's alone.
    per_rank = page.evaluate("document.querySelector('div.per-rank').textContent")
    assert per_rank.startswith("rank 0: thread 0, native 1000; rank 1: thread 1, native 1001;"), per_rank
    assert per_rank.endswith("rank 7: thread 7, native 1007; 56 more ranks"), per_rank
