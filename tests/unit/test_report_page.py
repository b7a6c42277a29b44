"""The report page from crafted data: sections present only where their data is, whatever the
job named things staying text, and a page whose elements close as they open."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from typing import Any, Dict, List, Tuple

from probing.cli.pictures.page import library_script
from probing.cli.pictures.report import chart_data, report_page
from probing.engine.report.live import Report, describe_threads

HOSTILE = "</script><img src=x onerror=alert(1)><!--"
VOID = {"meta", "br", "img", "input", "link", "hr", "wbr"}


def full_report(name: str = "worker") -> Report:
    frames = [
        {"pid": 7, "thread_id": 1, "native_id": 7, "thread_name": "MainThread", "is_main": True, "depth": 0,
         "func": "train", "file": "train.py", "lineno": 12, "frame_type": "Python", "code": "step()"},
        {"pid": 7, "thread_id": 2, "native_id": 8, "thread_name": name, "is_main": False, "depth": 0,
         "func": name, "file": name, "lineno": 3, "frame_type": "Python", "code": name},
    ]  # fmt: skip
    threads = describe_threads(frames, lambda frames: "sleeping")
    return Report(
        process={"pid": 7, "argv": ["train.py", name], "python_version": "3.11.7", "torch_version": "2.13.0",
                 "started_at": 1.7e9, "uptime_s": 3600.0, "rank": 1, "local_rank": 1, "world_size": 4,
                 "node": name, "executable": "/usr/bin/python3", "cwd": "/job", "probing_version": "0.1.0"},
        threads=threads, stacks_source="agent",
        hang={"hung": False, "reason": f"thread {name!r} moved", "duration_s": 2.0, "samples": 5,
              "took_s": 2.01, "worker": None, "threads": []},
        record=None,
        steps=[{"step": step, "seconds": 0.02 + step / 1000, "started": 1.7e9 + step} for step in range(10)],
        modules=[{"module": name, "module_type": name, "forward_s": 0.02, "backward_s": 0.01,
                  "optimizer_s": 0.0, "calls": 10, "steps": 10, "total_s": 0.03}],
        memory=[{"ts": 1.7e9 + i, "rss_mb": 100.0 + i, "cuda_allocated_mb": None, "cuda_reserved_mb": None,
                 "gc_objects": 1000 + i} for i in range(5)],
        nan_events=[{"step": 4, "seq": 2, "module": name, "module_type": name, "stage": "forward",
                     "tensor": name, "nan_count": 3, "inf_count": 0, "input_finite": True, "ts": 1.7e9}],
        nan_steps=[4], nan_event_count=1,
        object_types=[{"type": name, "count": 12, "size_mb": 1.5, "cuda_mb": None}],
        tensors=[{"name": name, "kind": "parameter", "shape": "[4, 4]", "dtype": "float32", "device": "cpu",
                  "bytes": 64, "requires_grad": True, "grad_fn": None}],
        has_torch=True, absent={}, notes=[name], timings={"total_s": 2.5}, generated_at=1.7e9 + 3600,
    )  # fmt: skip


def bare_report() -> Report:
    """What a job without torch, read from outside, leaves: stacks only."""
    full = full_report()
    return full._replace(
        process={"pid": 7, "argv": ["sleeper.py"], "python_version": "3.11"}, hang=None, steps=[],
        modules=[], memory=[], nan_events=[], nan_steps=[], nan_event_count=0, object_types=[], tensors=[],
        has_torch=False, stacks_source="py-spy", notes=[],
        absent={"agent": "thread 'x' holds the GIL", "torch": "torch is not imported"},
    )  # fmt: skip


class Structure(HTMLParser):
    """Every element's id, and whether each one closed in order."""

    def __init__(self) -> None:
        super().__init__()
        self.open: List[str] = []
        self.ids: List[str] = []
        self.errors: List[str] = []
        self.scripts: List[Tuple[Dict[str, Any], str]] = []
        self._script: Dict[str, Any] = {}

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Any]]) -> None:
        found = dict(attrs)
        if "id" in found:
            self.ids.append(found["id"])
        if tag == "script":
            self._script = found
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.open[-1:] or 'nothing'}")
            return
        self.open.pop()

    def handle_data(self, data: str) -> None:
        if self.open and self.open[-1] == "script":
            self.scripts.append((self._script, data))


def parsed(page: str) -> Structure:
    structure = Structure()
    structure.feed(page)
    structure.close()
    return structure


def test_every_section_is_there_when_its_data_is() -> None:
    page = report_page(full_report())
    structure = parsed(page)
    assert structure.errors == [] and structure.open == []
    for section in ("hang", "process", "steps", "modules", "memory", "nan", "threads", "objects", "tensors"):
        assert section in structure.ids
    assert {"chart-steps", "chart-modules", "chart-rss", "chart-gc"} <= set(structure.ids)
    assert "chart-cuda" not in structure.ids  # no CUDA figure in any sample
    assert library_script("chart") in page


def test_gc_objects_counted_once_or_twice_draw_no_empty_chart_and_say_why() -> None:
    """Issue 26: the "objects" chart was empty: on a large heap the sampler counts gc's objects
    rarely (a count holds the job's GIL), so only the start-up's count or two were there."""
    full = full_report()
    memory = [dict(point, gc_objects=None) for point in full.memory]
    memory[0]["gc_objects"] = 10838
    page = report_page(full._replace(memory=memory))
    structure = parsed(page)
    assert "chart-rss" in structure.ids and "chart-gc" not in structure.ids
    assert "counted at 1 of these 5 points, too few for a chart" in page
    assert "`probing 7 memory` counts them now" in page


def test_sections_without_data_are_left_out_and_say_why_once() -> None:
    page = report_page(bare_report())
    structure = parsed(page)
    assert structure.errors == []
    assert {"process", "threads", "outside"} <= set(structure.ids)
    for section in ("hang", "steps", "modules", "memory", "nan", "objects", "tensors"):
        assert section not in structure.ids
    assert not any(each.startswith("chart-") for each in structure.ids)
    assert "holds the GIL" in page and "torch is not imported" in page
    assert library_script("chart") not in page  # nothing to draw: no library either


def test_names_the_job_chose_stay_text_in_markup_and_in_the_data() -> None:
    report = full_report(HOSTILE)
    page = report_page(report)
    assert HOSTILE not in page and "<img" not in page
    structure = parsed(page)
    assert structure.errors == [] and structure.open == []
    data = next(text for attrs, text in structure.scripts if attrs.get("id") == "report-data")
    assert json.loads(data) == json.loads(json.dumps(chart_data(report)))
    assert json.loads(data)["modules"][0]["module"] == HOSTILE
    assert page.count("&lt;/script&gt;&lt;img") >= 8  # thread, frame, argv, node, module, NaN, types...


def test_a_record_shows_why_it_was_written_and_its_exception_first() -> None:
    report = full_report()._replace(
        hang=None,
        record={"path": "/r/job.probing", "kind": "record", "written_at": 1.7e9,
                "reason": {"kind": "exception", "message": f"ValueError: {HOSTILE}"},
                "exception": {"type": "ValueError", "message": HOSTILE, "thread": "MainThread",
                              "text": f"Traceback (most recent call last):\nValueError: {HOSTILE}\n"},
                "stuck": None, "verdict": "one snapshot"},
    )  # fmt: skip
    page = report_page(report)
    structure = parsed(page)
    assert structure.errors == []
    main = page.index("<main>")
    assert page.index('id="record"') < page.index('id="process"') and page.index('id="record"') > main
    assert "Record of PID 7" in page and "Traceback (most recent call last):" in page
    assert "<img" not in page


def test_many_nan_events_are_counted_not_all_listed() -> None:
    report = full_report()._replace(nan_event_count=250)
    page = report_page(report)
    assert "the first 1 of 250 events" in page


def test_a_nan_event_says_when_the_modules_weights_were_already_nonfinite() -> None:
    event = dict(full_report().nan_events[0], weights_finite=False, weights_already_nonfinite=True)
    page = report_page(full_report()._replace(nan_events=[event]))
    assert "NaN/Inf already when checks began (the cause is earlier)" in page
    older = report_page(full_report())  # a record of an older agent: no weights columns
    assert "its weights" in older and "already when checks began" not in older


def test_threads_come_main_first_and_the_main_one_open() -> None:
    page = report_page(full_report())
    threads = re.findall(r'<details class="thread"( open)?><summary><span class="tname">([^<]*)<', page)
    assert threads == [(" open", "MainThread"), ("", "worker")]
