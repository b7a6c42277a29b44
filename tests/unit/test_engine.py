"""The engine without a target process: one Target per process, the fallback policy, and
tables this side builds loaded into DuckDB as plain rows."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from probing.engine.backtrace import read_stacks
from probing.engine.target import Target
from probing.errors import UsageError
from probing.schema.tables import BACKTRACE, PROCESS_STATS
from probing.sql.session import SqlSession

PID = 4242


def pyspy_threads(holder: bool) -> List[Dict[str, Any]]:
    """A py-spy dump (its JSON) of a job whose worker thread holds the GIL in a C call."""
    return [
        {"thread_id": 1, "os_thread_id": PID, "thread_name": "MainThread", "owns_gil": False,
         "frames": [{"name": "join", "filename": "/usr/lib/threading.py", "line": 1119},
                    {"name": "<module>", "filename": "/job/train.py", "line": 9}]},
        {"thread_id": 2, "os_thread_id": PID + 1, "thread_name": "spinner", "owns_gil": holder,
         "frames": [{"name": "spin", "filename": "/job/train.py", "line": 4}]},
    ]  # fmt: skip


class SilentClient:
    """An agent that takes the request and never answers (its GIL is held)."""

    info = {"pid": PID, "python_version": "3.11.7", "argv": ["train.py"]}

    def __enter__(self) -> SilentClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def send(self, method: str, params: Dict[str, Any]) -> None:
        self.method = method

    def answered(self, timeout: float) -> bool:
        return False


@pytest.fixture
def gil_held(monkeypatch: pytest.MonkeyPatch) -> List[int]:
    """Every target's agent is silent; py-spy sees a thread holding the GIL. Returns the PIDs
    py-spy was run on."""
    looked: List[int] = []

    def dump(pid: int, native: bool = False, timeout: float = 2.0, locals: bool = False) -> Any:
        looked.append(pid)
        return pyspy_threads(holder=True)

    monkeypatch.setattr("probing.outside.pyspy.dump", dump)
    monkeypatch.setattr("probing.outside.pyspy.is_agent_thread", lambda thread: False)
    monkeypatch.setattr("probing.client.discovery.python_version_of", lambda pid: "3.11.7")
    monkeypatch.setattr(Target, "connect", lambda self, timeout, **options: SilentClient())
    return looked


def test_a_target_is_a_pid_or_an_agent_socket(tmp_path: Path) -> None:
    assert (Target("4242").pid, Target("4242").socket) == (4242, None)
    path = str(tmp_path / "agent.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        assert (Target(path).pid, Target(path).socket) == (None, path)
    for text in ("notapid", str(tmp_path), None):
        with pytest.raises(UsageError):
            Target(text)


def test_a_silent_agent_with_the_gil_held_is_answered_from_outside_with_the_reason(
    gil_held: List[int],
) -> None:
    stacks = read_stacks(Target(str(PID)), False, None, timeout=3.0)
    assert stacks.pid == PID and stacks.info["pid"] == PID
    assert {row["source"] for row in stacks.rows} == {"py-spy"}
    assert [row["func"] for row in stacks.rows if row["is_main"]] == ["join", "<module>"]
    assert stacks.notes == [
        "thread 'spinner' holds the GIL in spin (/job/train.py:4); answered from outside the process (py-spy)"
    ]
    # The look that decided to fall back is the answer: py-spy ran once.
    assert gil_held == [PID]


def test_targets_keep_their_own_state(gil_held: List[int]) -> None:
    """No state is shared between targets (the next issue runs one per rank, in threads)."""
    first, second = Target(str(PID)), Target(str(PID))
    assert first.gil_holder() is not None
    assert second.fresh_look() is None
    assert first.fresh_look() is not None
    assert first.fresh_look() is None  # a look answers once


def test_only_the_named_thread_is_kept(gil_held: List[int]) -> None:
    stacks = read_stacks(Target(str(PID)), False, "spinner", timeout=3.0)
    assert {row["thread_name"] for row in stacks.rows} == {"spinner"}


def test_no_module_of_the_engine_keeps_state_at_module_level() -> None:
    """Module globals of the engine are constants (names in capitals), functions and classes."""
    import importlib
    import inspect
    import pkgutil
    import types

    import probing.engine

    for module_info in pkgutil.walk_packages(probing.engine.__path__, "probing.engine."):
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if name.startswith("__") or name.isupper() or name in ("TYPE_CHECKING", "annotations"):
                continue
            assert (
                isinstance(value, (types.ModuleType, type))
                or inspect.isroutine(value)
                or (getattr(value, "__module__", None) == "typing")
            ), f"{module_info.name}.{name} = {value!r}"


def test_plain_rows_load_with_their_schema() -> None:
    """Tables this side builds (process.stats, stacks read from outside) skip the wire format."""
    session = SqlSession([BACKTRACE.describe(), PROCESS_STATS.describe()])
    row: List[Optional[Any]] = [None] * len(PROCESS_STATS.columns)
    row[:4] = [PID, "python", "sleeping", 0.0]
    row[PROCESS_STATS.column_names().index("rss_mb")] = float("nan")
    row[PROCESS_STATS.column_names().index("open_files")] = ["/job/data.bin"]
    row[PROCESS_STATS.column_names().index("children")] = [PID + 1]
    session.load_rows(PROCESS_STATS, [tuple(row)])
    result = session.run(
        "SELECT pid, name, year(create_time), isnan(rss_mb), open_files, children FROM process.stats"
    )
    assert result.rows == [(PID, "python", 1970, True, ["/job/data.bin"], [PID + 1])]
    frames = [(PID, 1, PID, "MainThread", True, 0, "f", "/a.py", 3, "Python", '{"x": "1"}', "py-spy")]
    session.load_rows(BACKTRACE, frames)
    session.load_rows(BACKTRACE, frames)  # a second load adds rows
    assert session.run("SELECT count(*), any_value(locals) FROM python.backtrace").rows == [(2, '{"x": "1"}')]
