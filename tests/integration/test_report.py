"""`probing PID report` and `probing FILE report` on real jobs, each page opened in headless
Chromium: nothing logged as an error, no request leaving the page, every chart painted, the
sections that apply there and those that do not absent."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from browser import Browser, Page, screenshot_path
from record_files import capture_record, exception_of

from probing.cli.pictures.page import data_script
from probing.cli.pictures.report import chart_data, report_page
from probing.engine.report.live import Report
from probing.engine.report.tables import MODULE_WINDOW_STEPS

from support import PROBING, Target, probing, wait_until

HOSTILE = "</script><img src=x onerror=window.pwned=1><b>"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser() as opened:
        yield opened


def report(target: str, output: Path, *args: str) -> float:
    """Write the report of `target` to `output`; the seconds it took."""
    started = time.monotonic()
    result = probing(target, "report", "-o", str(output), *args)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert f"probing: wrote {output} (" in result.stderr
    return took


def sections(page: Page) -> List[str]:
    found: List[str] = page.evaluate("[...document.querySelectorAll('section, .banner')].map(s => s.id)")
    return found


def painted(page: Page) -> Dict[str, int]:
    return {canvas["id"]: canvas["painted"] for canvas in page.marks()["canvases"]}


# Per chart, per dataset: the elements Chart.js laid out for a value that is there (finite and,
# for a bar, not zero). Axes, grid and labels are drawn with no data at all: pixels cannot tell.
DRAWN_MARKS = """[...document.querySelectorAll('canvas')].map(canvas => {
  const chart = Chart.getChart(canvas);
  if (!chart) return [canvas.id, []];
  const along = chart.options.indexAxis === 'y' ? 'x' : 'y';
  return [canvas.id, chart.data.datasets.map((set, i) => chart.getDatasetMeta(i).data.filter((element, j) => {
    const value = set.data[j];
    const number = value !== null && typeof value === 'object' ? value[along] : value;
    return !element.skip && Number.isFinite(number) && (chart.config.type !== 'bar' || number !== 0);
  }).length)];
})"""


def drawn(page: Page) -> Dict[str, List[int]]:
    """Chart id -> the marks each of its datasets drew."""
    return dict(page.evaluate(DRAWN_MARKS))


def every_chart_drew(page: Page) -> bool:
    charts = drawn(page)
    return bool(charts) and all(sets and all(count > 0 for count in sets) for sets in charts.values())


def text_of(page: Page) -> str:
    found: str = page.evaluate("document.body.innerText")
    return found


def trace_status(pid: int) -> Dict[str, Any]:
    result = probing(str(pid), "trace", "status", "--format", "json")
    assert result.returncode == 0, result.stderr
    found: Dict[str, Any] = json.loads(result.stdout)
    return found


@pytest.mark.pictures
def test_a_traced_torch_job_and_its_record(browser: Browser, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    records = tmp_path / "records"
    records.mkdir(mode=0o700)
    args = ["--slow", "--poison", "forward", "--poison-at", "40"]
    with Target("torch_job.py", via="plain", args=args, env={"PROBING_RECORD_DIR": str(records)}) as job:
        assert probing(str(job.pid), "trace", "on", "--backward").returncode == 0
        assert probing(str(job.pid), "nan", "on").returncode == 0
        assert wait_until(lambda: trace_status(job.pid)["step"] >= 30, 60.0, 0.2)
        live = tmp_path / "job.html"
        took = report(str(job.pid), live)
        assert took < 15, took  # a 2 s hang check, the tables, the object scan
        page = browser.open(live)
        assert page.problems() == []
        shown = sections(page)
        for section in (
            "hang",
            "process",
            "steps",
            "modules",
            "memory",
            "nan",
            "threads",
            "tensors",
        ):
            assert section in shown, shown
        assert "outside" not in shown and "objects" not in shown  # python.tensors walked the objects
        assert {"chart-steps", "chart-modules", "chart-rss"} <= set(drawn(page)) and every_chart_drew(page)
        words = text_of(page)
        assert "the job's objects are walked once" in words
        assert "Progressing" in words and re.search(r"torch\s+2\.", words)
        # model.2 sleeps 20 ms in every forward: the slowest module after the model holding it.
        modules = page.evaluate("[...document.querySelectorAll('#modules tbody tr td:first-child')]"
                                ".map(td => td.textContent)")  # fmt: skip
        assert modules[:2] == ["model", "model.2"], modules
        page.screenshot(screenshot_path(tmp_path, "report.png"))

        written = probing(str(job.pid), "record")
        assert written.returncode == 0, written.stderr
        assert job.alive()
        exception = exception_of("ValueError", HOSTILE, "train.py", 101, "train")
        reason = {"kind": "exception", "message": f"ValueError: {HOSTILE}"}
        raised = capture_record(job.pid, str(tmp_path), "raised.probing", reason, exception)
    record = next(records.glob("*.probing"))
    crash = tmp_path / "crash.html"
    assert report(str(record), crash) < 10
    page = browser.open(crash)
    assert page.problems() == []
    shown = sections(page)
    assert shown[0] == "record" and "hang" not in shown
    for section in ("process", "steps", "modules", "memory", "nan", "threads"):
        assert section in shown, shown
    assert every_chart_drew(page)
    assert "Written because: on demand" in text_of(page)
    assert re.search(r"torch\s+2\.", text_of(page))  # the record's header keeps torch's version
    shown_numbers(page, record)

    # A job that died of an exception: the reason and the traceback first, in red.
    output = tmp_path / "raised.html"
    report(raised, output)
    page = browser.open(output)
    assert page.problems() == []
    assert page.evaluate("document.querySelector('.banner').id") == "record"
    assert page.evaluate("document.querySelector('#record').className") == "banner bad"
    banner = page.evaluate("document.querySelector('#record').innerText")
    assert "Written because: exception" in banner and "Traceback (most recent call last):" in banner
    assert f"ValueError: {HOSTILE}" in banner and page.evaluate("window.pwned === undefined")
    page.screenshot(screenshot_path(tmp_path, "report-record.png"))


def test_a_job_without_torch_has_no_torch_sections(browser: Browser, tmp_path: Path) -> None:
    with Target("sleeper.py") as job:
        output = tmp_path / "plain.html"
        report(str(job.pid), output, "--hang-duration", "1")
    page = browser.open(output)
    assert page.problems() == []
    shown = sections(page)
    assert {"process", "threads", "memory", "objects"} <= set(shown), shown
    assert not {"steps", "modules", "nan", "tensors"} & set(shown), shown
    assert "torch is not imported in this process" in text_of(page)
    assert every_chart_drew(page)
    threads = page.evaluate("[...document.querySelectorAll('.thread .tname')].map(e => e.textContent)")
    assert threads[0] == "MainThread" and "worker" in threads


def test_a_job_whose_thread_holds_the_gil_is_read_from_outside(browser: Browser, tmp_path: Path) -> None:
    with Target("gil_holder.py") as job:
        output = tmp_path / "gil.html"
        took = report(str(job.pid), output, "--hang-duration", "1")
        assert job.alive()
    assert took < 10, took  # the agent is not waited for: py-spy answers
    page = browser.open(output)
    assert page.problems() == []
    shown = sections(page)
    assert shown[0] == "outside" and "threads" in shown and "hang" in shown
    assert not {"memory", "objects", "steps"} & set(shown), shown
    words = text_of(page)
    assert "The stacks were read from outside the process (py-spy)" in words
    assert "thread 'gil-holder' holds the GIL" in words
    assert "holds the GIL" in page.evaluate("document.querySelector('#threads').innerText")
    page.screenshot(screenshot_path(tmp_path, "report-gil.png"))


def test_names_the_job_chose_stay_text(browser: Browser, tmp_path: Path) -> None:
    """A thread named like markup, and front_hostile's names that are not text at all."""
    with Target("front_hostile.py") as job:
        started = probing(
            str(job.pid), "eval",
            f"import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), name={HOSTILE!r},"
            " daemon=True).start()",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        output = tmp_path / "hostile.html"
        report(str(job.pid), output, "--hang-duration", "0")
    page = browser.open(output)
    assert page.problems() == []
    assert page.evaluate("window.pwned === undefined && document.querySelectorAll('img').length === 0")
    names = page.evaluate("[...document.querySelectorAll('.thread .tname')].map(e => e.textContent)")
    assert HOSTILE in names
    assert any(name.startswith("odd") for name in names)
    assert page.evaluate("JSON.parse(document.getElementById('report-data').textContent) !== null")


def query(target: str, sql: str) -> List[Dict[str, Any]]:
    result = probing(target, "query", "--format", "json", sql)
    assert result.returncode == 0, result.stderr
    rows: List[Dict[str, Any]] = json.loads(result.stdout)
    return rows


def shown_numbers(page: Page, record: Path) -> None:
    """The page's numbers are the table's: the last step time (from its start to the next
    step's) and model.2's forward mean per step, against SQL of our own over the same record."""
    starts = query(
        str(record),
        "SELECT step, min(epoch(ts) - time_offset) AS started FROM python.torch_trace "
        "GROUP BY step ORDER BY step DESC LIMIT 2",
    )
    newest, last = starts  # the newest step is under way: the last whole one is before it
    period = (newest["started"] - last["started"]) / (newest["step"] - last["step"])
    figure = page.evaluate("document.querySelector('#steps .figures div b').textContent")
    assert figure == (f"{period * 1000:.1f} ms" if period < 1 else f"{period:.2f} s"), (figure, period)
    # The window of the modules table: MODULE_WINDOW_STEPS step numbers up to the last whole
    # step. Tracing samples steps: the step under way may be several numbers past it.
    window = f"step <= {last['step']} AND step > {last['step']} - {MODULE_WINDOW_STEPS}"
    mean = query(
        str(record),
        "SELECT sum(duration) FILTER (WHERE module = 'model.2' AND stage = 'forward') / count(DISTINCT step) "
        f"AS mean FROM python.torch_trace WHERE {window}",
    )[0]["mean"]
    cell = page.evaluate(
        "[...document.querySelectorAll('#modules tbody tr')].find(r => r.cells[0].textContent === 'model.2')"
        ".cells[2].textContent"
    )
    assert cell == f"{mean * 1000:.1f} ms", (cell, mean)


def test_the_marks_check_fails_on_a_page_whose_data_is_lost(browser: Browser, tmp_path: Path) -> None:
    """The check above can fail: the same charts with every value lost draw axes but no marks."""
    report = Report(
        process={"pid": 7, "argv": ["train.py"]}, threads=[], stacks_source="agent", hang=None, record=None,
        steps=[{"step": n, "seconds": 0.03, "traced_s": 0.02} for n in range(10)],
        modules=[{"module": "model.2", "module_type": "Middle", "forward_s": 0.02, "backward_s": 0.01,
                  "optimizer_s": 0.0, "total_s": 0.03, "calls": 10, "steps": 10}],
        memory=[{"ts": 1.7e9 + n, "rss_mb": 100.0 + n, "cuda_allocated_mb": None, "cuda_reserved_mb": None,
                 "gc_objects": 1000 + n} for n in range(5)],
        nan_events=[], nan_steps=[], nan_event_count=0, object_types=[], tensors=[], has_torch=True,
        absent={}, notes=[], timings={}, generated_at=1.7e9,
    )  # fmt: skip
    whole = report_page(report)
    data = chart_data(report)
    lost = dict(data, steps=[dict(step, seconds=None, traced_s=None) for step in data["steps"]],
                modules=[dict(m, forward_s=0, backward_s=0, optimizer_s=0) for m in data["modules"]],
                memory=[dict(m, rss_mb=None, gc_objects=None) for m in data["memory"]])  # fmt: skip
    assert data_script("report-data", data) in whole
    (tmp_path / "whole.html").write_text(whole)
    (tmp_path / "lost.html").write_text(whole.replace(data_script("report-data", data),
                                                      data_script("report-data", lost)))  # fmt: skip
    page = browser.open(tmp_path / "whole.html")
    assert page.problems() == [] and every_chart_drew(page)
    page = browser.open(tmp_path / "lost.html")
    assert not every_chart_drew(page), drawn(page)
    assert all(count > 0 for count in painted(page).values())  # what the old check counted: it passed


def test_many_threads_make_a_bounded_page(browser: Browser, tmp_path: Path) -> None:
    with Target("sleeper.py") as job:
        started = probing(
            str(job.pid), "eval",
            "import threading\nfor n in range(600):\n"
            "    threading.Thread(target=threading.Event().wait, name=f'pool-{n}', daemon=True).start()",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        output = tmp_path / "many.html"
        result = probing(str(job.pid), "report", "-o", str(output), "--hang-duration", "0")
        assert result.returncode == 0 and "(" in result.stderr, result.stderr
        # All of them, not the entries drawn.
        assert re.search(r"\b60\d threads\b", result.stderr), result.stderr
    assert output.stat().st_size < 600_000
    page = browser.open(output)
    assert page.problems() == []
    words = page.evaluate("document.querySelector('#threads').innerText")
    assert "60" in words and "same stack on 600 threads" in words, words[:400]
    assert page.evaluate("document.querySelectorAll('details.thread').length") < 10


def test_trace_on_and_no_step_done_yet_says_so(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with Target("torch_job.py", via="plain", args=["--gate"]) as job:
        assert probing(str(job.pid), "trace", "on").returncode == 0
        output = tmp_path / "gate.html"
        report(str(job.pid), output, "--hang-duration", "0")
    page = output.read_text()
    assert "tracing is on, but no traced step has finished yet" in page and "trace on` records" not in page


def test_stdout_output_of_a_job_whose_argv_is_not_utf8(tmp_path: Path) -> None:
    with Target("sleeper.py", args=["\udcff\udcfe-arg"]) as job:
        result = subprocess.run([PROBING, str(job.pid), "report", "-o", "-", "--hang-duration", "0"],
                                capture_output=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert b"\\udcff\\udcfe-arg" in result.stdout and result.stdout.endswith(b"</html>\n")


def test_an_output_that_cannot_be_written_fails_before_the_job_is_probed(tmp_path: Path) -> None:
    with Target("sleeper.py", via="plain") as job:
        started = time.monotonic()
        result = probing(str(job.pid), "report", "-o", str(tmp_path / "nowhere" / "job.html"))
        assert result.returncode == 2 and "cannot write" in result.stderr, result.stderr
        assert time.monotonic() - started < 5
        assert not os.path.exists(f"/tmp/probing-0/{job.pid}.sock")  # no agent was put in


def test_a_target_that_dies_during_the_report_gives_a_partial_page(browser: Browser, tmp_path: Path) -> None:
    output = tmp_path / "dies.html"
    with Target("sleeper.py") as job:
        cli = subprocess.Popen(
            [PROBING, "-v", str(job.pid), "report", "-o", str(output),
             "--hang-duration", "1", "--hang-samples", "2"],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert cli.stderr is not None
        # -v: one connection reads the stacks, the next fetches the tables; the job is killed
        # then, and what follows (the tables, the census, the hang check) fails.
        connects = 0
        for line in cli.stderr:
            connects += "connected in" in line
            if connects == 2:
                break
        job.kill()
        rest = cli.stderr.read()
        assert cli.wait(60) == 14, rest
    assert "the page is partial" in rest and "exited during the report" in rest
    page = browser.open(output)
    assert page.problems() == []
    assert page.evaluate("document.querySelector('.banner').id") == "partial"
    assert f"PID {job.pid} exited during the report" in text_of(page)
    assert "threads" in sections(page)
