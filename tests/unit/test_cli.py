"""The command line without a target process: parsing, rendering, errors and exit codes.

The agent is replaced by a fake client here; tests/integration/ runs the real thing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from typing import Any, Dict, List, Optional

import click
import pytest
from click.testing import CliRunner

from probing.agent.columns import TableBuilder
from probing.cli import group, main
from probing.cli.fast import parse_backtrace
from probing.cli.invocation import Invocation
from probing.engine.target import Target
from probing.errors import ExitCode, RemoteError
from probing.protocol.tables import DecodedTable, decode_table
from probing.schema.tables import AGENT_TABLES as TABLES
from probing.schema.tables import BACKTRACE

MAIN, WORKER = 1001, 1002


def backtrace_table(with_locals: bool = False) -> DecodedTable:
    descriptor, chunks = backtrace_builder(with_locals).encode()
    return decode_table(descriptor, bytearray(b"".join(bytes(c) for c in chunks)))


def backtrace_builder(with_locals: bool = False) -> Any:
    builder = TableBuilder(BACKTRACE.name, BACKTRACE.column_types())
    frames = {
        WORKER: [("wait", "/job/threading.py", 320), ("run", "/job/worker.py", 7)],
        MAIN: [
            ("step", "/job/train.py", 30),
            ("train", "/job/train.py", 41),
            ("<module>", "/job/train.py", 50),
        ],
    }
    for ident, name in ((MAIN, "MainThread"), (WORKER, "loader")):
        for depth, (func, file, line) in enumerate(frames[ident]):
            local_values = '{"batch": "Tensor(shape=[32, 8])"}' if with_locals and depth == 0 else None
            builder.append((4242, ident, ident + 5, name, ident == MAIN, depth, func, file, line,
                            "Python", local_values, "agent"))  # fmt: skip
    return builder


class FakeClient:
    info = {"pid": 4242, "python_version": "3.11.7", "argv": ["train.py", "--epochs", "3"]}

    def __init__(self, eval_result: Optional[Dict[str, Any]] = None, eval_error: Optional[Exception] = None):
        self.eval_result = eval_result or {"value": None, "stdout": "", "stderr": ""}
        self.eval_error = eval_error
        self.calls: List[Any] = []

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def send(self, method: str, params: Dict[str, Any]) -> None:
        self.calls.append((method, params))
        self.params = params

    def answered(self, timeout: float) -> bool:
        return True

    def receive(self, method: str, timeout: Optional[float] = None) -> Any:
        if method == "backtrace":
            descriptor, chunks = backtrace_builder(bool(self.params.get("locals"))).encode()
            return {"table": descriptor}, bytearray(b"".join(bytes(c) for c in chunks))
        if method == "tables":
            return {"tables": self.describe_tables()}, b""
        if self.eval_error is not None:
            raise self.eval_error
        return self.eval_result, b""

    def call(self, method: str, params: Dict[str, Any], timeout: Optional[float] = None) -> Any:
        self.send(method, params)
        return self.receive(method, timeout)

    def describe_tables(self) -> List[Dict[str, Any]]:
        return [table.describe() for table in TABLES.values()]

    def fetch_table(
        self, name: str, params: Optional[Dict[str, Any]] = None, timeout: Optional[float] = None
    ) -> DecodedTable:
        self.calls.append(("fetch", name))
        if name == "python.backtrace":
            return backtrace_table()
        return TableBuilder(name, []).encode() and DecodedTable(name, 0, [])


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient()
    monkeypatch.setattr(Target, "connect", lambda self, timeout, **options: client)
    return client


def invoke(*args: str, input: Optional[str] = None) -> Any:
    return CliRunner().invoke(group.cli, list(args), input=input, prog_name="probing")


def test_backtrace_reads_like_a_traceback_main_thread_first(fake: FakeClient) -> None:
    result = invoke("4242", "backtrace")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "Process 4242 (Python 3.11.7): train.py --epochs 3"
    assert lines[2] == 'Thread 1006 "MainThread", main thread: running Python (most recent call last):'
    assert lines[3:6] == [
        '  File "/job/train.py", line 50, in <module>',
        '  File "/job/train.py", line 41, in train',
        '  File "/job/train.py", line 30, in step',
    ]
    assert 'Thread 1007 "loader": running Python (most recent call last):' in lines


def test_backtrace_locals_are_printed_under_their_frame(fake: FakeClient) -> None:
    result = invoke("4242", "backtrace", "--locals")
    assert "      batch = Tensor(shape=[32, 8])" in result.output.splitlines()
    assert fake.calls == [("backtrace", {"locals": True, "thread": None})]


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "table"])
def test_backtrace_rows_formats_carry_the_table_columns(fake: FakeClient, fmt: str) -> None:
    import csv
    import io
    import json

    result = invoke("-t", "4242", "backtrace", "--format", fmt)
    assert result.exit_code == 0, result.output
    columns = [column.name for column in BACKTRACE.columns]
    if fmt == "json":
        rows = json.loads(result.output)
        assert [list(row) for row in rows] == [columns] * 5
    elif fmt == "jsonl":
        rows = [json.loads(line) for line in result.output.splitlines()]
        assert len(rows) == 5 and list(rows[0]) == columns
    elif fmt == "csv":
        rows = list(csv.reader(io.StringIO(result.output)))
        assert rows[0] == columns and len(rows) == 6
    else:
        assert result.output.splitlines()[0].split() == columns


def test_eval_prints_output_then_value(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient(eval_result={"value": "42", "stdout": "hello\n", "stderr": ""})
    monkeypatch.setattr(Target, "connect", lambda self, timeout, **options: client)
    result = invoke("4242", "eval", "print('hello'); 42")
    assert result.exit_code == 0 and result.output == "hello\n42\n"
    assert client.calls[0] == (
        "eval",
        {"code": "print('hello'); 42", "frame": None, "timeout": 10.0},
    )


def test_eval_reads_code_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient()
    monkeypatch.setattr(Target, "connect", lambda self, timeout, **options: client)
    result = invoke("4242", "eval", "--frame", "MainThread:train", "-", input="for i in x:\n    print(i)\n")
    assert result.exit_code == 0
    assert client.calls[0][1]["code"] == "for i in x:\n    print(i)\n"
    assert client.calls[0][1]["frame"] == "MainThread:train"


def test_remote_exception_exits_with_its_code_and_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = RemoteError("ZeroDivisionError: division by zero", traceback="Traceback ...\nZeroDivisionError\n")
    client = FakeClient(eval_error=error)
    monkeypatch.setattr(Target, "connect", lambda self, timeout, **options: client)
    result = invoke("4242", "eval", "1/0")
    assert result.exit_code == ExitCode.REMOTE_ERROR
    assert "ZeroDivisionError" in result.output and "probing: error" not in result.output


def test_empty_code_is_a_usage_error(fake: FakeClient) -> None:
    result = invoke("4242", "eval", "   ")
    assert result.exit_code == ExitCode.USAGE and "empty code" in result.output


def test_query_fetches_only_the_tables_it_names(fake: FakeClient) -> None:
    result = invoke("4242", "query", "SELECT func FROM python.backtrace WHERE depth = 0 ORDER BY func")
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["func", "----", "step", "wait"]
    assert ("fetch", "python.backtrace") in fake.calls
    assert ("fetch", "python.threads") not in fake.calls


def test_bad_sql_exits_with_its_code_and_no_traceback(fake: FakeClient) -> None:
    result = invoke("4242", "query", "SELECT nope FROM python.backtrace")
    assert result.exit_code == ExitCode.BAD_SQL
    assert result.output.startswith("probing: error: SQL: Binder Error:")
    assert "Traceback" not in result.output


def test_tables_lists_every_column_with_its_meaning(fake: FakeClient) -> None:
    result = invoke("4242", "tables")
    for table in TABLES.values():
        assert f"{table.name}: {table.doc}" in result.output
        for column in table.columns:
            assert column.doc in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["backtrace"], "missing TARGET"),
        (["notapid", "backtrace"], "TARGET must be a PID"),
        (["4242"], "Missing command"),
        (["4242", "nosuchcommand"], "No such command"),
        (["4242", "backtrace", "--format", "xml"], "Invalid value for '--format'"),
        (["4242", "backtrace", "--timeout", "0"], "Invalid value for '--timeout'"),
        (["4242", "list"], "'list' takes no TARGET"),
        (["run"], "Missing argument"),
    ],
)
def test_usage_errors_exit_2(fake: FakeClient, args: List[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert message in result.output


def test_help_documents_every_exit_code() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for code, meaning in ExitCode.MEANINGS.items():
        assert f"{code:>3}  {meaning}" in result.output


def test_exit_codes_are_distinct() -> None:
    codes = [value for value in vars(ExitCode).values() if isinstance(value, int)]
    assert len(codes) == len(set(codes)) == len(ExitCode.MEANINGS)


def test_no_such_process_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["999999999", "backtrace"]) == ExitCode.NO_SUCH_PROCESS
    assert "no process with PID 999999999" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["4242", "backtrace"],
        ["-t", "4242", "backtrace"],
        ["--target=4242", "backtrace"],
        ["-v", "4242", "backtrace", "--locals"],
        ["4242", "-v", "backtrace", "--thread", "MainThread"],
        ["4242", "backtrace", "--thread=worker", "--format", "json"],
        ["4242", "backtrace", "--format=csv", "--timeout", "1.5", "--locals"],
        ["--no-attach", "4242", "--attach-timeout", "2", "backtrace"],
        ["--attach-timeout=0.5", "-t", "4242", "backtrace", "--thread", "x"],
    ],
)
def test_fast_path_parses_as_click_does(monkeypatch: pytest.MonkeyPatch, args: List[str]) -> None:
    seen: Dict[str, Any] = {}

    def capture(invocation: Invocation, **options: Any) -> int:
        seen.update(options, target=invocation.target_text, verbose=invocation.verbose)
        seen.update(no_attach=invocation.no_attach, attach_timeout=invocation.attach_timeout)
        return 0

    monkeypatch.setattr(group, "show_backtrace", capture)
    assert invoke(*args).exit_code == 0
    assert parse_backtrace(args) == seen


@pytest.mark.parametrize(
    "args",
    [
        ["backtrace"],
        ["4242", "backtrace", "--help"],
        ["4242", "backtrace", "--format", "xml"],
        ["4242", "backtrace", "--timeout", "-1"],
        ["4242", "backtrace", "--locals=yes"],
        ["4242", "backtrace", "--thread"],
        ["4242", "eval", "1"],
        ["notapid", "backtrace"],
        ["-t", "1", "-t", "2", "backtrace"],
        ["4242", "backtrace", "extra"],
        ["4242", "--attach-timeout", "0", "backtrace"],
        ["4242", "--no-attach=1", "backtrace"],
        ["4242", "-v=1", "backtrace"],
    ],
)
def test_fast_path_leaves_everything_else_to_click(args: List[str]) -> None:
    assert parse_backtrace(args) is None


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_json_rows_are_valid_json_even_with_nan(fmt: str) -> None:
    """JSON has no NaN or Infinity: they are written as null, which every parser reads."""
    import io
    import json

    from probing.cli.render.rows import write_rows

    out = io.StringIO()
    rows = [(float("nan"), float("inf"), -float("inf"), 1.5)]
    write_rows(["a", "b", "c", "d"], ["DOUBLE"] * 4, rows, fmt, out)
    text = out.getvalue()
    assert "NaN" not in text and "Infinity" not in text
    parsed = json.loads(text) if fmt == "json" else [json.loads(line) for line in text.splitlines()]
    assert parsed == [{"a": None, "b": None, "c": None, "d": 1.5}]


def test_a_value_that_begins_with_a_comment_is_no_option() -> None:
    """SQL opening with a `--` comment (the debugging guide's), or `eval "-- 1"`, is a value;
    `--`, `--format` and `--format=json` stay what they are."""
    from probing.cli.group import _values_not_options

    sql = "-- Find slowest operations\nSELECT 1"
    assert _values_not_options(["1", "query", sql, "--format", "json"]) == [
        "1",
        "query",
        f"\n{sql}",
        "--format",
        "json",
    ]
    assert _values_not_options(["1", "eval", "-- 1"]) == ["1", "eval", "\n-- 1"]
    assert _values_not_options(["1", "query", "--", "--format=json", "--x"]) == [
        "1",
        "query",
        "--",
        "--format=json",
        "--x",
    ]


def test_every_registered_command_loads_under_its_own_name() -> None:
    context = click.Context(group.cli)
    names = group.cli.list_commands(context)
    assert set(group.COMMANDS) < set(names) and "backtrace" in names
    for name in names:
        command = group.cli.get_command(context, name)
        assert command is not None and command.name == name, name


def test_a_command_loads_its_own_module_and_no_other_commands() -> None:
    code = (
        "import sys; from probing.cli import main; main(['999999999', 'eval', '1']); "
        "print(sorted(m for m in sys.modules if m.startswith('probing.cli.') and m.count('.') == 2))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    modules = set(ast.literal_eval(loaded.stdout.splitlines()[-1]))
    assert "probing.cli.eval" in modules
    others = {f"probing.cli.{at.split(':')[0]}" for name, at in group.COMMANDS.items() if name != "eval"}
    assert not modules & others, modules & others
