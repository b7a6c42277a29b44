"""The renderer's one JSON writer: what every `--format json` goes through."""

from __future__ import annotations

import datetime
import io
import json
from typing import Any

import pytest

from probing.cli.render.json_writer import write_json


def test_nan_and_infinity_become_null_at_any_depth() -> None:
    out = io.StringIO()
    nan, inf = float("nan"), float("inf")
    write_json({"a": nan, "b": [1.5, -inf, {"c": (inf, 2)}], "d": "NaN"}, out)
    assert json.loads(out.getvalue()) == {"a": None, "b": [1.5, None, {"c": [None, 2]}], "d": "NaN"}
    assert "Infinity" not in out.getvalue()


def test_values_json_lacks_are_written_as_people_expect() -> None:
    out = io.StringIO()
    write_json([datetime.datetime(2026, 1, 2, 3, 4, 5), b"\x01\xff", datetime.timedelta(seconds=1.5)], out)
    assert json.loads(out.getvalue()) == ["2026-01-02T03:04:05", "01ff", 1.5]


@pytest.mark.parametrize("format", ["json"])
def test_hang_json_goes_through_the_writer(format: str, capsys: pytest.CaptureFixture[str]) -> None:
    from probing.analysis.progress import HangReport, ThreadReport
    from probing.cli.render.reports import write_hang

    class Answer:
        notes: Any = []
        worker = None
        main = ThreadReport(1, 1, 1, "MainThread", True, False, float("nan"), float("inf"), "sleeping", "f")
        report = HangReport(1, True, 1.0, 2, [main], None)

    write_hang(Answer(), format)
    thread = json.loads(capsys.readouterr().out)["threads"][0]
    assert thread["wakeups_per_s"] is None and thread["cpu_percent"] is None
