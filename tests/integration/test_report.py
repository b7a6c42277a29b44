"""`probing PID report` and `probing FILE report` on real jobs, each page opened in headless
Chromium: nothing logged as an error, no request leaving the page, every chart painted, the
sections that apply there and those that do not absent."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from browser import Browser, Page, screenshot_path
from record_files import capture_record, exception_of

from support import Target, probing, wait_until

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
            "objects",
            "tensors",
        ):
            assert section in shown, shown
        assert "outside" not in shown
        charts = painted(page)
        assert charts["chart-steps"] > 0 and charts["chart-modules"] > 0 and charts["chart-rss"] > 0
        words = text_of(page)
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
    assert painted(page)["chart-steps"] > 0
    assert "Written because: on demand" in text_of(page)

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
    assert all(count > 0 for count in painted(page).values())
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
