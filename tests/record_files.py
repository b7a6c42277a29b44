"""Real record files for the tests of records as targets, made without the agent's own writer:
the tables of a live job are fetched through the client as any command fetches them, and written
with protocol.records.write_record under a header as the records contract
(notes/records-contract.md) lays it out. A fatal-signal file is the header line and what
faulthandler writes when a target segfaults (tests/targets/segfaults_to_file.py).
"""

from __future__ import annotations

import array
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from probing import __version__
from probing.client.connection import Client
from probing.client.discovery import locate_socket
from probing.protocol.records import write_record
from probing.protocol.tables import ColumnBuffers, encode_table

from support import TARGETS, VENV_PYTHON

# What the agent would hold at the end of a training job: the tables a record is meant to have.
RECORD_TABLES = (
    "python.backtrace", "python.threads", "process.info", "python.torch_trace", "python.nan_events",
    "process.memory",
)  # fmt: skip


def header(
    pid: int, argv: List[str], reason: Dict[str, Any], exception: Optional[Dict[str, Any]] = None,
    tables: Sequence[str] = (), rank: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:  # fmt: skip
    """A record header with every key of the contract."""
    return {
        "probing_version": __version__, "pid": pid, "ppid": os.getpid(), "uid": os.geteuid(),
        "hostname": socket.gethostname(), "argv": argv, "cwd": os.getcwd(), "executable": VENV_PYTHON,
        "python_version": ".".join(map(str, sys.version_info[:3])), "started_at": None,
        "written_at": time.time(),
        "reason": {"kind": None, "message": "", "signal": None, "exit_status": None, **reason},
        "exception": exception, "rank": rank, "tables": list(tables), "notes": [], "write_seconds": 0.0,
    }  # fmt: skip


def capture_record(
    pid: int, directory: str, name: str, reason: Dict[str, Any],
    exception: Optional[Dict[str, Any]] = None, tables: Sequence[str] = RECORD_TABLES,
    locals: bool = True,
) -> str:  # fmt: skip
    """Fetch `tables` from the agent of `pid` and write them as the record `directory/name`."""
    fetched = []
    with Client(locate_socket(pid, lambda message: None), 30.0, lambda message: None, pid=pid) as client:
        client.call("ping")
        argv = list(client.info.get("argv") or [])
        for table in tables:
            params: Dict[str, Any] = {"name": table}
            if table == "python.backtrace" and locals:
                params["locals"] = True
            result, payload = client.call("table", params, timeout=60.0)
            fetched.append((result["table"], [bytes(payload)]))
    head = header(pid, argv, reason, exception, [descriptor["name"] for descriptor, _ in fetched])
    return write_record(directory, name, head, fetched)


def exception_of(error_type: str, message: str, file: str, lineno: int, func: str) -> Dict[str, Any]:
    text = (
        "Traceback (most recent call last):\n"
        f'  File "{file}", line {lineno}, in {func}\n'
        f"{error_type}: {message}\n"
    )
    return {"type": error_type, "message": message, "text": text, "thread": "MainThread",
            "frames": [{"file": file, "lineno": lineno, "func": func}]}  # fmt: skip


def segfault_file(directory: str, name: str = "segfaults-1.fatal", python: str = VENV_PYTHON) -> str:
    """Run tests/targets/segfaults_to_file.py, which arms faulthandler on `directory/name` after the
    header line, as the agent does, and dies of SIGSEGV in a called function."""
    path = os.path.join(directory, name)
    completed = subprocess.run(
        [python, str(TARGETS / "segfaults_to_file.py"), path], capture_output=True, timeout=60
    )
    assert completed.returncode == -11, completed.stderr.decode(errors="replace")
    return path


def write_fatal_header(path: str, pid: int, argv: List[str]) -> None:
    """A .fatal file of a job that died without a trace: only the header line."""
    head = header(pid, argv, {"kind": "fatal_signal"})
    with open(path, "w") as out:
        out.write("#probing-fatal 1 " + json.dumps(head) + "\n")


# Hand-made tables (descriptor, payload chunks), as write_record takes them.
TableFrame = Tuple[Dict[str, Any], List[Any]]


def _doubles(values: List[float]) -> bytes:
    return array.array("d", values).tobytes()


def _ints(values: List[int]) -> bytes:
    return array.array("q", values).tobytes()


def _words(codes: List[int]) -> bytes:
    return array.array("i", codes).tobytes()


def memory_with_text_rss() -> TableFrame:
    """process.memory whose rss_mb is VARCHAR (the schema says DOUBLE): the reviewer's case."""
    columns = [
        ColumnBuffers("ts", "TIMESTAMP", _doubles([1.0, 2.0]), None, None),
        ColumnBuffers("rss_mb", "VARCHAR", _words([0, 1]), None, ["big", "bigger"]),
    ]
    descriptor, chunks = encode_table("process.memory", 2, columns)
    return descriptor, chunks


def backtrace_with_numeric_file() -> TableFrame:
    """python.backtrace whose file is BIGINT (the schema says VARCHAR)."""
    columns = [
        ColumnBuffers("thread_id", "BIGINT", _ints([1]), None, None),
        ColumnBuffers("depth", "BIGINT", _ints([0]), None, None),
        ColumnBuffers("func", "VARCHAR", _words([0]), None, ["main"]),
        ColumnBuffers("file", "BIGINT", _ints([42]), None, None),
        ColumnBuffers("lineno", "BIGINT", _ints([3]), None, None),
    ]
    descriptor, chunks = encode_table("python.backtrace", 1, columns)
    return descriptor, chunks


def good_backtrace() -> TableFrame:
    columns = [
        ColumnBuffers("thread_id", "BIGINT", _ints([1]), None, None),
        ColumnBuffers("thread_name", "VARCHAR", _words([0]), None, ["MainThread"]),
        ColumnBuffers("depth", "BIGINT", _ints([0]), None, None),
        ColumnBuffers("func", "VARCHAR", _words([0]), None, ["main"]),
        ColumnBuffers("file", "VARCHAR", _words([0]), None, ["/nowhere/job.py"]),
        ColumnBuffers("lineno", "BIGINT", _ints([3]), None, None),
        ColumnBuffers("locals", "JSON", _words([0]), None, ['{"token": "secret"}']),
    ]
    descriptor, chunks = encode_table("python.backtrace", 1, columns)
    return descriptor, chunks
