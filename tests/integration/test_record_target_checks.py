"""A known table whose column has another type than probing's schema, from a record file or from a
live (scripted) agent: the command says which table and column, with the exit code of a bad
record (15) or a bad reply (13), never a traceback from a renderer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest
from record_files import backtrace_with_numeric_file, memory_with_text_rss
from test_front_replies import ROW, ScriptedAgent, frame, hello

from probing.agent.columns import TableBuilder
from probing.errors import ExitCode
from probing.protocol.records import write_record
from probing.schema.tables import BACKTRACE

from support import probing


@pytest.mark.parametrize(
    ("table", "command", "column"),
    [(memory_with_text_rss, "memory", "rss_mb"), (backtrace_with_numeric_file, "backtrace", "file")],
    ids=["memory-rss_mb-VARCHAR", "backtrace-file-BIGINT"],
)
def test_a_record_whose_column_has_another_type_is_a_bad_record(
    tmp_path: Path, table: Any, command: str, column: str
) -> None:
    path = write_record(str(tmp_path), "typed.probing", {"pid": 7, "argv": ["job.py"]}, [table()])
    result = probing(path, command)
    assert result.returncode == ExitCode.BAD_RECORD, result.stderr
    assert repr(column) in result.stderr and "Traceback" not in result.stderr


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    scripted = ScriptedAgent(os.environ["PROBING_SOCKET_DIR"])
    yield scripted
    scripted.close()


def backtrace_with_a_numeric_file() -> bytes:
    columns = [(c.name, "BIGINT" if c.name == "file" else c.type) for c in BACKTRACE.columns]
    builder = TableBuilder(BACKTRACE.name, columns)
    builder.append([42 if c.name == "file" else ROW[c.name] for c in BACKTRACE.columns])
    descriptor, chunks = builder.encode()
    return frame({"id": 2, "ok": True, "result": {"table": descriptor}}, b"".join(bytes(c) for c in chunks))


@pytest.mark.parametrize("native", ["1", "0"], ids=["native-front-hands-over", "python-cli"])
def test_a_live_reply_whose_column_has_another_type_is_a_bad_reply(agent: ScriptedAgent, native: str) -> None:
    agent.reply = hello() + backtrace_with_a_numeric_file()
    result = probing(str(os.getpid()), "backtrace", env={"PROBING_NATIVE_FRONT": native})
    assert result.returncode == ExitCode.BAD_REPLY, result.stderr
    assert "python.backtrace" in result.stderr and "'file'" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
