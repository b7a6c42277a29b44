"""`probing list` as people read it: a table that fits the terminal (whole lines to a pipe, for
scripts), `unknown` where this user cannot tell whether a job has an agent, and probing's own
processes left out."""

from __future__ import annotations

import io
import json
from typing import List

import pytest
from click.testing import CliRunner

from probing.cli import group, list_processes
from probing.cli.render.rows import write_table
from probing.engine.listing import PythonProcess

LONG_COMMAND = "/usr/bin/python3 /home/someone/jobs/train.py " + " ".join(
    f"--option-{n} value" for n in range(20)
)
PROCESSES = [
    PythonProcess(101, "root", "3.11", None, None, None, None, "/usr/bin/python3 root_job.py"),
    PythonProcess(102, "me", "3.11", True, "abc12345", 0, 0, LONG_COMMAND),
    PythonProcess(103, "me", "3.11", False, None, None, None, "/usr/bin/python3 plain.py"),
]
COLUMNS = ["pid", "user", "agent", "command"]
TYPES = ["BIGINT", "VARCHAR", "BOOLEAN", "VARCHAR"]


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(list_processes, "python_processes", lambda: list(PROCESSES))


def test_a_table_fits_the_width_it_is_given_by_cutting_the_last_column() -> None:
    out = io.StringIO()
    rows = [(1, "root", True, LONG_COMMAND), (22, "me", False, "python short.py")]
    write_table(COLUMNS, TYPES, rows, out, fit=100)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[2].endswith("...") and lines[3].endswith("python short.py")
    whole = io.StringIO()
    write_table(COLUMNS, TYPES, rows, whole)
    assert LONG_COMMAND in whole.getvalue()  # without a width (a pipe), every line whole


def test_list_says_unknown_where_it_cannot_tell_and_scripts_get_null(listed: None) -> None:
    runner = CliRunner()
    table = runner.invoke(group.cli, ["list"])
    rows = {line.split()[0]: line.split() for line in table.output.splitlines()[2:]}
    assert (rows["101"][3], rows["102"][3], rows["103"][3]) == ("unknown", "true", "false")
    assert LONG_COMMAND in table.output  # CliRunner's stdout is no terminal: lines stay whole
    answer = json.loads(runner.invoke(group.cli, ["list", "--format", "json"]).output)
    assert [row["agent"] for row in answer] == [None, True, False]
    csv_lines = runner.invoke(group.cli, ["list", "--format", "csv"]).output.splitlines()
    assert csv_lines[1].startswith("101,root,3.11,,")


@pytest.mark.parametrize(
    "argv, ours",
    [
        (["/venv/bin/python3", "/venv/bin/probing-python", "list"], True),
        (["/venv/bin/python3", "-u", "/venv/bin/probing-python", "run", "--", "python", "x.py"], True),
        (["python3", "-m", "probing", "4242", "backtrace"], True),
        (["python3", "train.py", "--out", "probing-python"], False),
        (["python3", "-m", "torch.distributed.run", "train.py"], False),
        (["python3", "/work/probing/train.py"], False),
        ([], False),
    ],
)
def test_probings_own_processes_are_told_from_jobs(argv: List[str], ours: bool) -> None:
    from probing.engine.listing import is_probing_cli

    assert is_probing_cli(argv) is ours
