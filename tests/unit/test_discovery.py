"""Where the CLI looks for a process's agent socket (client/discovery.py), on this test's own
process: what it reads of a process is read once per process, and anew for a reused PID."""

from __future__ import annotations

import os
from typing import Any, List, Optional

import pytest

from probing.client import discovery


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> List[int]:
    """The PIDs whose view (namespaces, root, own PID) discovery read, in order."""
    read: List[int] = []
    real = discovery.View

    def counted(pid: int) -> Any:
        read.append(pid)
        return real(pid)

    monkeypatch.setattr(discovery, "View", counted)
    monkeypatch.setattr(discovery, "_seen", {})
    return read


def test_a_process_is_read_once_for_every_connect_of_a_command(reads: List[int]) -> None:
    pid = os.getpid()
    first = discovery.socket_candidates(pid)
    assert all(path.endswith(f"/{pid}.sock") for path in first)
    assert [discovery.socket_candidates(pid) for _ in range(9)] == [first] * 9
    assert reads == [pid]


def test_a_pid_reused_by_a_new_process_or_one_without_a_start_time_is_read_anew(
    reads: List[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    pid = os.getpid()
    started: List[Optional[int]] = [100]
    monkeypatch.setattr(discovery, "start_ticks", lambda _: started[0])
    discovery.socket_candidates(pid)
    started[0] = 200  # a new process under the same number
    discovery.socket_candidates(pid)
    started[0] = None  # gone, or /proc unreadable: nothing is kept
    discovery.socket_candidates(pid)
    discovery.socket_candidates(pid)
    assert reads == [pid] * 4


def test_our_socket_directory_is_read_at_every_call(
    reads: List[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    pid = os.getpid()
    monkeypatch.delenv("PROBING_SOCKET_DIR", raising=False)
    before = discovery.socket_candidates(pid)
    monkeypatch.setenv("PROBING_SOCKET_DIR", "/elsewhere")
    assert f"/elsewhere/{pid}.sock" in discovery.socket_candidates(pid) and reads == [pid]
    assert f"/elsewhere/{pid}.sock" not in before
