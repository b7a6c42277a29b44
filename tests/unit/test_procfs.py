"""/proc parsing, on this very process (its threads are known)."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Optional

import pytest

from probing import procfs


def test_thread_names_are_the_os_names_of_every_thread() -> None:
    started, stop = threading.Event(), threading.Event()

    def named() -> None:
        # What pthread_setname_np does on Linux.
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write("probing-test")
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=named)
    thread.start()
    try:
        started.wait(10)
        names = procfs.thread_names(os.getpid())
        assert names[thread.native_id] == "probing-test"
        assert procfs.thread_name(thread.native_id) == "probing-test"
        assert os.getpid() in names
    finally:
        stop.set()
        thread.join()


def test_counters_of_a_thread_that_waits() -> None:
    waiting, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (waiting.set(), stop.wait(10)))
    thread.start()
    try:
        waiting.wait(10)
        pid, tid = os.getpid(), thread.native_id
        assert procfs.thread_cpu_ticks(pid, tid) is not None
        assert (procfs.thread_wakeups(pid, tid) or 0) >= 0
        assert procfs.thread_work_done(pid, tid) is not None
        # It blocks in futex once it gets past waiting.set(): wait to see that, not for time.
        deadline = time.monotonic() + 10
        while procfs.thread_syscall(pid, tid) == -1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert (procfs.thread_syscall(pid, tid) or -1) >= 0
        assert procfs.thread_syscall(pid, 2**31 - 1) is None
    finally:
        stop.set()
        thread.join()


def test_facts_of_this_process() -> None:
    pid = os.getpid()
    assert procfs.process_alive(pid)
    assert procfs.effective_uid(pid) == os.geteuid()
    assert procfs.python_version(pid) is not None
    assert procfs.command_line(pid) == sys.orig_argv
    start = procfs.process_start_time()
    assert start is not None and start == procfs.start_time(pid)
    resident, virtual, threads = procfs.memory_and_threads()
    assert resident and virtual and threads
    assert procfs.thread_cpu_seconds(threading.get_native_id())[0] is not None


def test_a_process_that_is_gone() -> None:
    assert not procfs.process_alive(2**22 + 1)
    assert procfs.thread_names(2**22 + 1) == {}
    try:
        procfs.python_version(2**22 + 1)
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("python_version of a process that is gone must raise FileNotFoundError")


@pytest.mark.parametrize(
    "name, version",
    [
        ("python3.11", "3.11"), ("python3.13t", "3.13"), ("python3.11d", "3.11"),
        ("python3", ""), ("python", ""), ("pypy3", None), ("python3.x", None), ("node", None),
    ],
)  # fmt: skip
def test_the_python_version_is_read_from_the_executable_name_without_re(
    name: str, version: Optional[str]
) -> None:
    assert procfs._version_in_executable_name(name) == version


def test_running_threads_counts_this_thread_running() -> None:
    assert (procfs.running_threads(os.getpid()) or 0) >= 1  # this one, reading /proc
    assert procfs.running_threads(2**22 + 1) is None  # no such process
