"""A live job whose text is not UTF-8 (lone surrogates in its argv, a thread's name, its locals
and a __repr__ of its own: tests/targets/surrogates.py) is shown, never a traceback: each lone
surrogate as its escape (`\\ud83d`), on a terminal and in a pipe, whatever the error handler of the
CLI's stdout (strict under a UTF-8 locale or PYTHONIOENCODING=utf-8, surrogateescape under C).
Its SQL is the user's and runs: the job's argv is not a reason to blame the query (exit 9)."""

from __future__ import annotations

import csv
import io
import json
from typing import Iterator

import pytest

from support import Target, probing

ESCAPED = "caf\\ud83d-\\udc00-\\udcff-\\udfff"
# The stream error handlers the CLI's stdout may have (PYTHONIOENCODING sets it).
STDOUTS = {
    "strict": {"PYTHONIOENCODING": "utf-8"},
    "surrogateescape": {"PYTHONIOENCODING": "utf-8:surrogateescape"},
}


@pytest.fixture(scope="module")
def job() -> Iterator[Target]:
    with Target("surrogates.py") as target:
        yield target


@pytest.mark.parametrize("stdout", list(STDOUTS))
def test_backtrace_with_locals_shows_lone_surrogates_as_their_escapes(job: Target, stdout: str) -> None:
    result = probing(str(job.pid), "backtrace", "--locals", env=STDOUTS[stdout])
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert ESCAPED in result.stdout.splitlines()[0]  # argv, in the heading
    assert f'"worker-{ESCAPED}"' in result.stdout  # the thread's name
    assert f"text = '{ESCAPED}'" in result.stdout  # repr escapes it already
    assert f"odd = odd {ESCAPED}" in result.stdout  # the job's own __repr__ does not


@pytest.mark.parametrize("stdout", list(STDOUTS))
def test_memory_shows_the_argv_of_lone_surrogates(job: Target, stdout: str) -> None:
    result = probing(str(job.pid), "memory", env=STDOUTS[stdout])
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert ESCAPED in result.stdout


def test_a_query_of_the_argv_runs_in_every_format(job: Target) -> None:
    sql = "SELECT argv FROM process.info"
    table = probing(str(job.pid), "query", sql, env=STDOUTS["strict"])
    assert table.returncode == 0, table.stderr  # not 9: the SQL is fine
    assert "caf\\\\ud83d" in table.stdout  # the JSON text of a string holding `\ud83d`
    rows = json.loads(probing(str(job.pid), "query", sql, "--format", "json").stdout)
    assert rows[0]["argv"][-1] == ESCAPED
    written = probing(str(job.pid), "query", sql, "--format", "csv", env=STDOUTS["strict"])
    assert written.returncode == 0, written.stderr
    (value,) = [row[0] for row in csv.reader(io.StringIO(written.stdout))][1:]
    assert json.loads(value)[-1] == ESCAPED


def test_a_query_of_thread_names_runs(job: Target) -> None:
    sql = "SELECT name FROM python.threads WHERE name LIKE 'worker-%'"
    result = probing(str(job.pid), "query", sql, "--format", "csv", env=STDOUTS["strict"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == [f"worker-{ESCAPED}"]
