"""`probing PID query` and `tables` against real targets, under every CPython on the machine."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from probing.errors import ExitCode

from support import Target, interpreter_params, probing

SEED_QUERIES = [
    "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10",
    "SELECT func, file, lineno FROM python.backtrace WHERE depth = 0",
    "SELECT func, file, lineno FROM python.backtrace WHERE depth < 5",
]


@pytest.fixture(scope="module", params=interpreter_params())
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    with Target("sleeper.py", python=request.param) as started:
        yield started


@pytest.mark.parametrize("sql", SEED_QUERIES)
def test_seed_queries_run_verbatim(target: Target, sql: str) -> None:
    result = probing(str(target.pid), "query", "--format", "json", sql)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert rows and list(rows[0])[:3] == ["func", "file", "lineno"]


def test_where_each_thread_is_now(target: Target) -> None:
    result = probing(str(target.pid), "query", SEED_QUERIES[1] + " ORDER BY func")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["func", "file", "lineno"]
    assert [line.split()[0] for line in lines[2:]] == ["main_loop", "wait"]


def test_threads_as_json(target: Target) -> None:
    result = probing(str(target.pid), "query", "--format", "json", "SELECT * FROM python.threads")
    rows = json.loads(result.stdout)
    assert [row["name"] for row in rows] == ["MainThread", "worker"]
    assert list(rows[0]) == ["pid", "thread_id", "native_id", "name", "daemon", "is_main", "alive",
                             "cpu_user_s", "cpu_system_s"]  # fmt: skip
    assert rows[0]["is_main"] is True and rows[1]["daemon"] is True
    assert rows[0]["native_id"] == target.pid
    assert isinstance(rows[0]["cpu_user_s"], float)


def test_process_info(target: Target) -> None:
    result = probing(str(target.pid), "query", "--format", "json", "SELECT * FROM process.info")
    (info,) = json.loads(result.stdout)
    assert info["pid"] == target.pid and info["argv"][0].endswith("sleeper.py")
    assert info["probing_version"] and info["implementation"] == "cpython"
    assert info["python_version"].startswith("3.")
    assert info["start_time"] <= info["agent_start_time"]


def test_joins_and_unqualified_names(target: Target) -> None:
    sql = (
        "SELECT t.name, count(*) AS frames FROM backtrace b JOIN threads t USING (thread_id) "
        "GROUP BY t.name ORDER BY t.name"
    )
    result = probing(str(target.pid), "query", "--format", "csv", sql)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "name,frames"
    assert [line.split(",")[0] for line in result.stdout.splitlines()[1:]] == [
        "MainThread",
        "worker",
    ]


def test_information_schema_sees_every_table(target: Target) -> None:
    sql = "SELECT DISTINCT table_schema || '.' || table_name AS t FROM information_schema.columns ORDER BY t"
    result = probing(str(target.pid), "query", "--format", "jsonl", sql)
    assert [json.loads(line)["t"] for line in result.stdout.splitlines()] == [
        "process.info",
        "process.memory",
        "process.stats",
        "python.asyncio_tasks",
        "python.backtrace",
        "python.collectives",
        "python.gc",
        "python.gc_generations",
        "python.modules",
        "python.nan_events",
        "python.optimizers",
        "python.process_groups",
        "python.tensors",
        "python.threads",
        "python.torch_trace",
        "torch.cuda_memory",
    ]


def test_sql_from_stdin(target: Target) -> None:
    result = probing(str(target.pid), "query", "-", input="SELECT count(*) AS n\nFROM python.threads\n")
    assert result.stdout.split() == ["n", "-", "2"]


def test_bad_sql_is_one_message_and_an_exit_code(target: Target) -> None:
    result = probing(str(target.pid), "query", "SELECT func FROM python.backtrac")
    assert result.returncode == ExitCode.BAD_SQL
    assert result.stderr.startswith(
        "probing: error: SQL: Catalog Error: Table with name backtrac does not exist"
    )
    assert 'hint: Did you mean "backtrace"' in result.stderr
    assert "Traceback" not in result.stderr
    assert target.alive()


def test_tables_describes_every_column(target: Target) -> None:
    text = probing(str(target.pid), "tables")
    assert text.returncode == 0
    assert "python.backtrace: One row per frame" in text.stdout
    assert "  depth        BIGINT   0 for the innermost frame" in text.stdout
    described = json.loads(probing(str(target.pid), "tables", "--format", "json").stdout)
    assert [table["name"] for table in described] == [
        "python.backtrace",
        "python.threads",
        "python.asyncio_tasks",
        "process.info",
        "process.memory",
        "python.torch_trace",
        "python.nan_events",
        "python.modules",
        "python.tensors",
        "python.optimizers",
        "python.gc",
        "python.gc_generations",
        "torch.cuda_memory",
        "python.collectives",
        "python.process_groups",
        "process.stats",
    ]
    assert all(column["doc"] for table in described for column in table["columns"])
