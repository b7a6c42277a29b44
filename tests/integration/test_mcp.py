"""`probing mcp` as an assistant meets it: started as a subprocess over stdio by the MCP SDK's own
client, against live jobs (one process, a torchrun job), with a refused eval, read-only SQL, bad
targets and a target that dies in the middle of a call."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Tuple

import pytest

from support import PROBING, Target, TorchrunJob

mcp = pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'probing[mcp]')")
anyio = pytest.importorskip("anyio")

from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

READING = {
    "list_processes",
    "ranks",
    "backtrace",
    "query",
    "hang",
    "stragglers",
    "memory",
    "records",
    "report",
}
CHANGING = {"eval", "trace", "nan"}
Session = Callable[[ClientSession], Awaitable[Any]]
CALL_S = 100.0
# Each test makes several calls, each a CLI start and an answer: seconds apiece on a loaded machine.
pytestmark = pytest.mark.timeout(360)


def serve(work: Session, *flags: str) -> Tuple[Any, str]:
    """`work` done against a fresh `probing mcp FLAGS` through the SDK's stdio client; its result
    and what the server wrote on stderr. Its records are those of a folder of its own (the
    machine's, as root every user's, are the other tests' to write and prune meanwhile)."""
    records = tempfile.mkdtemp(prefix="probing-mcp-records-")

    async def session() -> Any:
        environment = {key: value for key, value in os.environ.items() if key != "PROBING"}
        environment["PROBING_RECORD_DIR"] = records
        parameters = StdioServerParameters(command=PROBING, args=["mcp", *flags], env=environment)
        async with stdio_client(parameters, errlog=log) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                with anyio.fail_after(330):
                    return await work(client)

    try:
        with tempfile.TemporaryFile("w+") as log:
            result = anyio.run(session)
            log.seek(0)
            return result, log.read()
    finally:
        os.rmdir(records)


async def call(client: ClientSession, tool: str, **arguments: Any) -> Tuple[bool, str, Dict[str, Any]]:
    """A tool's answer: whether it is an error, its text, its structured content. A call that
    has not answered within CALL_S fails the test naming the tool (each tool's own deadline is
    its CLI's timeouts plus a minute: under a loaded machine's test run, a call takes seconds)."""
    try:
        with anyio.fail_after(CALL_S):
            answer = await client.call_tool(tool, arguments)
    except TimeoutError:
        raise AssertionError(f"the {tool} call did not answer within {CALL_S:.0f} s") from None
    text = "".join(getattr(block, "text", "") for block in answer.content)
    return bool(answer.is_error), text, answer.structured_content or {}


def test_an_assistant_reads_a_live_process_through_every_reading_tool() -> None:
    page = f"page-{uuid.uuid4().hex[:8]}.html"
    with Target("sleeper.py") as target:

        async def work(client: ClientSession) -> Dict[str, Any]:
            listed = await client.list_tools()
            seen = {
                "tools": {tool.name: tool for tool in listed.tools},
                "list": await call(client, "list_processes"),
                "backtrace": await call(client, "backtrace", target=str(target.pid)),
                "query": await call(
                    client,
                    "query",
                    target=str(target.pid),
                    sql="SELECT thread_name, count(*) AS frames FROM python.backtrace GROUP BY 1 ORDER BY 1",
                ),  # fmt: skip
                "few": await call(
                    client, "query", target=str(target.pid), sql="SELECT * FROM range(500)", max_rows=7
                ),
                "memory": await call(client, "memory", target=str(target.pid)),
                "records": await call(client, "records"),
                "report": await call(client, "report", target=str(target.pid), name=page),
            }
            return seen

        seen, _ = serve(work)
        assert target.alive(), "the job died"
    tools = seen["tools"]
    assert set(tools) == READING | CHANGING
    assert all(tools[name].annotations.read_only_hint for name in READING)
    assert not any(tools[name].annotations.read_only_hint for name in CHANGING)
    assert "target" in tools["backtrace"].input_schema["properties"]

    error, text, data = seen["list"]
    assert not error and target.pid in [row["pid"] for row in data["result"]["processes"]], data
    assert text.endswith("distributed jobs")

    error, text, data = seen["backtrace"]
    assert not error, text
    threads = data["result"]["threads"]
    assert threads[0]["name"] == "MainThread" and threads[0]["ranks"] is None
    assert threads[0]["frames"][-1].startswith("main_loop (") and threads[0]["frames"][0].startswith(
        "<module> ("
    )
    assert text.splitlines()[0].startswith("MainThread: main_loop (")
    assert (
        data["command"] == f"probing --target={target.pid} backtrace --format json" and data["exit_code"] == 0
    )

    error, text, data = seen["query"]
    assert not error and text == "2 rows", (text, data)
    assert [row["thread_name"] for row in data["result"]["rows"]] == ["MainThread", "worker"]
    error, text, data = seen["few"]
    assert not error and data["result"]["row_count"] == 500 and len(data["result"]["rows"]) == 7
    assert data["result"]["rows_left_out"] == 493 and "the first 7 given" in text

    error, text, data = seen["memory"]
    assert not error and text.startswith("RSS ") and data["result"]["pid"] == target.pid
    error, text, data = seen["records"]
    assert not error and text == "0 records" and data["result"]["records"] == [], (text, data)
    error, text, data = seen["report"]
    written = Path(tempfile.gettempdir()) / f"probing-reports-{os.getuid()}" / page
    assert not error and data["result"]["path"] == str(written), text
    assert written.read_text().lstrip().lower().startswith("<!doctype html")
    written.unlink()


def test_changing_tools_refuse_without_the_flag_and_are_logged_with_it() -> None:
    with Target("sleeper.py") as target:
        pid = str(target.pid)

        async def refused(client: ClientSession) -> List[Tuple[bool, str, Dict[str, Any]]]:
            return [
                await call(client, "eval", target=pid, code="import builtins; builtins.MARK = 'set'"),
                await call(client, "trace", target=pid, action="on"),
                await call(client, "nan", target=pid, action="on", stop=True),
            ]

        answers, quiet = serve(refused)

        async def allowed(client: ClientSession) -> Tuple[bool, str, Dict[str, Any]]:
            return await call(
                client, "eval", target=pid, code="getattr(__import__('builtins'), 'MARK', 'unset')"
            )

        mark, logged = serve(allowed, "--allow-changes")
        assert target.alive()
    for error, text, data in answers:
        assert error and "started without --allow-changes" in text and data == {}, (text, data)
    assert "probing mcp: eval(" not in quiet
    error, text, data = mark
    assert not error and text == "'unset'", (text, data)  # the refused eval ran nothing
    assert f"probing mcp: eval(target='{pid}', code=\"getattr(" in logged, logged


def test_sql_reads_the_tables_and_nothing_else_and_bad_targets_get_the_clis_words(tmp_path: Path) -> None:
    written = tmp_path / "stolen.csv"
    with Target("sleeper.py") as target:
        pid = str(target.pid)

        async def work(client: ClientSession) -> List[Tuple[bool, str, Dict[str, Any]]]:
            return [
                await call(client, "query", target=pid, sql=f"COPY (SELECT 1) TO '{written}'"),
                await call(client, "query", target=pid, sql="SELECT * FROM read_text('/etc/hostname')"),
                await call(client, "query", target=pid, sql="SET enable_external_access = true"),
                await call(client, "backtrace", target="--help"),
                await call(client, "backtrace", target=""),
                await call(client, "backtrace", target="999999999"),
                await call(client, "report", target=pid, name="../../etc/cron.d/x.html"),
                await call(client, "hang", target=pid, duration=1e9),
            ]

        answers, _ = serve(work)
        assert target.alive()
    assert not written.exists()
    for error, text, data in answers[:3]:
        assert error and data["exit_code"] == 9 and text.startswith("error: SQL: "), (text, data)
    error, text, data = answers[3]
    assert error and data["exit_code"] == 2 and "TARGET must be a PID" in text and "not '--help'" in text
    assert answers[4][0] and "target is empty" in answers[4][1]
    error, text, data = answers[5]
    assert error and data["exit_code"] == 3 and "no process with PID 999999999" in text
    assert answers[6][0] and answers[6][1].startswith("name must be a file name ending .html")
    assert answers[7][0] and "duration must be more than 0 and at most 600 seconds" in answers[7][1]


def test_a_target_that_dies_in_the_middle_of_a_call_gets_an_answer_and_the_server_goes_on() -> None:
    target = Target("sleeper.py")
    try:

        async def work(client: ClientSession) -> Tuple[Any, Any, float]:
            answers: List[Any] = []

            async def watch() -> None:
                answers.append(await call(client, "hang", target=str(target.pid), duration=4.0))

            started = time.monotonic()
            async with anyio.create_task_group() as group:
                group.start_soon(watch)
                await anyio.sleep(1.5)
                target.kill()
            return answers[0], await call(client, "list_processes"), time.monotonic() - started

        (hang, listed, took), _ = serve(work)
    finally:
        target.kill()
    error, text, data = hang
    assert error and data["exit_code"] not in (0, 11), (text, data)  # not "hung": the job is gone
    assert text and took < 60
    assert not listed[0] and target.pid not in [row["pid"] for row in listed[2]["result"]["processes"]]


def test_a_torchrun_job_is_read_whole_with_identical_stacks_folded() -> None:
    with TorchrunJob("healthy", ranks=2) as job:

        async def work(client: ClientSession) -> List[Tuple[bool, str, Dict[str, Any]]]:
            return [
                await call(client, "ranks", target=str(job.agent_pid)),
                await call(client, "backtrace", target=str(job.pids[1]), ranks="all"),
                await call(client, "hang", target=str(job.agent_pid), ranks="all", duration=3.0),
            ]

        (ranks, stacks, hang), _ = serve(work)
    error, text, data = ranks
    assert (
        not error
        and text.startswith("2 ranks of job ")
        and [row["rank"] for row in data["result"]["ranks"]] == [0, 1]
    ), data
    error, text, data = stacks
    assert not error, text
    mains = [thread for thread in data["result"]["threads"] if thread["is_main"]]
    assert sorted(rank for thread in mains for rank in thread["ranks"]) == [0, 1], mains
    assert "MainThread of ranks " in text or "MainThread of ranks 0" in text
    assert all(set(thread["pids"]) <= set(job.pids.values()) for thread in data["result"]["threads"])
    error, text, data = hang
    assert not error and data["exit_code"] == 0 and data["result"]["hung"] is False, (text, data)


def test_a_call_past_its_deadline_is_stopped_with_everything_it_started() -> None:
    import psutil

    from probing.mcp.calls import run_cli

    with Target("sleeper.py") as target:
        started = time.monotonic()
        answer = anyio.run(
            run_cli, [f"--target={target.pid}", "hang", "--duration=30", "--format", "json"], 2.0
        )
        took = time.monotonic() - started
        assert target.alive()
    assert answer.exit_code == -1 and "stopped after 2 s" in answer.stderr and took < 10, (answer, took)
    assert answer.meaning == "the call ran past its deadline and was stopped"
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if "--duration=30" in (p.info["cmdline"] or [])]
    assert left == []


def test_an_answer_larger_than_the_bound_fails_saying_so_rather_than_answer_a_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from probing.mcp import calls
    from probing.mcp.tools import answered

    monkeypatch.setattr(calls, "MAX_OUTPUT_BYTES", 4)
    answer = anyio.run(calls.run_cli, ["--version"], 60.0)
    assert answer.exit_code == 1 and len(answer.stdout) == 4
    result = answered(answer, "never said")
    assert result["is_error"] and "the answer was larger than 0 MiB: ask for less" in result["text"]
