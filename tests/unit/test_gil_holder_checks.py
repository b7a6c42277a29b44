"""Which thread py-spy's owns_gil may name (outside/gil.py, outside/pyspy.py checked_gil), on
this test's own process: no target. The looks at /proc over real targets are in
tests/integration/hostile/test_pool_parent.py."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest

from probing.outside import gil
from probing.outside.pyspy import checked_gil, gil_holder, is_agent_thread

GIL_C = Path(__file__).resolve().parents[2] / "native" / "front" / "gil.c"


def thread(os_thread_id: Any, name: Optional[str] = None, owns_gil: bool = True) -> Dict[str, Any]:
    """One thread as pyspy.threads_of shapes py-spy's, with one frame."""
    frame = {"name": "work", "filename": "/job/work.py", "module": None, "short_filename": "work.py",
             "line": 7, "locals": None}  # fmt: skip
    return {"pid": os.getpid(), "thread_id": 140000000000000, "os_thread_id": os_thread_id,
            "thread_name": name, "active": True, "owns_gil": owns_gil, "frames": [frame]}  # fmt: skip


def test_the_native_front_end_takes_the_same_looks() -> None:
    text = GIL_C.read_text()
    defined = dict(re.findall(r"^#define (HOLD_LOOK_US|HOLD_LOOKS|STILL_LOOKS) (\d+)$", text, re.M))
    assert defined == {
        "HOLD_LOOK_US": str(round(gil.HOLD_LOOK_S * 1e6)),
        "HOLD_LOOKS": str(gil.HOLD_LOOKS),
        "STILL_LOOKS": str(gil.STILL_LOOKS),
    }


@pytest.mark.parametrize(
    "os_thread_id",
    [0, None, -1, True, "1", os.getppid(), 1 << 62],
    ids=["0: a thread starting", "None: an id py-spy did not find", "negative", "bool", "text",
         "another process's", "no such thread"],
)  # fmt: skip
def test_a_thread_that_is_no_thread_of_the_process_is_never_named(os_thread_id: Any) -> None:
    """ "thread '0' holds the GIL" (a thread state of a thread not started yet, matched when no
    thread holds the GIL), "thread 'None'" and exited threads' ids (py-spy up to 3.10)."""
    threads = checked_gil(os.getpid(), [thread(os_thread_id)])
    assert threads[0]["owns_gil"] is False
    assert gil_holder(threads) is None
    assert not gil.keeps_the_gil(os.getpid(), os_thread_id)


@pytest.fixture
def named_thread() -> Iterator[int]:
    """The OS id of a thread of this process, parked until the test ends."""
    native: Dict[str, int] = {}
    parked = threading.Event()
    done = threading.Event()

    def park() -> None:
        native["id"] = threading.get_native_id()
        parked.set()
        done.wait(30)

    worker = threading.Thread(target=park, daemon=True)
    worker.start()
    parked.wait(10)
    yield native["id"]
    done.set()
    worker.join(10)


def name_thread(tid: int, name: str) -> None:
    with open(f"/proc/self/task/{tid}/comm", "w") as comm:
        comm.write(name)


def test_a_dummy_thread_is_told_by_its_os_name(named_thread: int) -> None:
    """Code run in an agent thread may make threading give it a name ("Dummy-N": a thread
    threading did not start); py-spy then names the agent thread so. Its OS name says whose it
    is; a thread threading started is still judged by its threading name."""
    name_thread(named_thread, "probing-agent")
    assert is_agent_thread(thread(named_thread, "Dummy-4"))
    assert not is_agent_thread(thread(named_thread, "Thread-2 (worker)"))
    assert not is_agent_thread(thread(named_thread, "Dummy-x"))
    name_thread(named_thread, "python3")
    assert not is_agent_thread(thread(named_thread, "Dummy-4"))


def test_the_threads_py_spy_flags_beside_the_one_looked_at_keep_no_flag(named_thread: int) -> None:
    """Every thread py-spy flags has the GIL's thread id; only the first real thread is looked
    at (one look, whatever the dump holds), and one that is another thread loses its flag."""
    threads = checked_gil(os.getpid(), [thread(0), thread(None), thread(os.getpid(), "MainThread"),
                                        thread(named_thread, "other"), thread(0)])  # fmt: skip
    mine = [each["owns_gil"] for each in threads]
    assert mine[:2] == [False, False] and mine[3:] == [False, False]


def test_probings_own_threads_lose_the_flag_unlooked_at(named_thread: int) -> None:
    """The thread that loads the agent holds the GIL while it works and ends right after: named
    "probing-..." when py-spy read it, gone (and nameless) by the time the verdict was written,
    and then blamed as the job's ("thread '21204' holds the GIL in _high_descriptor")."""
    name_thread(named_thread, "probing-attach")
    threads = checked_gil(os.getpid(), [thread(named_thread), thread(named_thread, "Dummy-2")])
    assert [each["owns_gil"] for each in threads] == [False, False]
    assert gil_holder(threads) is None


def test_the_attach_helpers_thread_is_told_by_its_script_when_it_is_gone() -> None:
    """The helper's thread, py-spy read loading the agent (in install_records: _high_descriptor),
    had ended by the time the CLI looked for its OS name, and showed in the job's backtrace as a
    thread of the job (seen in CI under load). Its outermost frame is the helper's script."""
    helper = thread(1 << 62, "Dummy-3")
    helper["frames"] = [
        dict(helper["frames"][0], name="_high_descriptor", filename="/x/probing/agent/records/fatal.py"),
        dict(helper["frames"][0], name="<module>", filename="/venv/lib/probing/bootstrap/attach.py"),
    ]
    assert is_agent_thread(helper)
    job = thread(1 << 62, None)  # a job's thread that ran the script's code lower down is the job's
    job["frames"] = [dict(helper["frames"][1], name="_attach"), dict(helper["frames"][0], name="main")]
    assert not is_agent_thread(job)


def test_an_agent_thread_is_told_by_its_bootstrap_when_it_is_gone() -> None:
    """A connection's thread, read by py-spy as its client gave up on it and ended before the CLI
    looked for its OS name, showed in a 3.15 job's backtrace (the suite under load). Every agent
    thread's outermost frame is AgentThread._bootstrap in agent/threads.py."""
    reader = thread(1 << 62, None)
    reader["frames"] = [
        dict(reader["frames"][0], name="_recv_counted", filename="/venv/lib/probing/protocol/frames.py"),
        dict(reader["frames"][0], name="_serve_connection", filename="/venv/lib/probing/agent/server.py"),
        dict(reader["frames"][0], name="_bootstrap", filename="/venv/lib/probing/agent/threads.py"),
    ]
    assert is_agent_thread(reader)
    job = thread(1 << 62, None)  # a job's thread in threading's bootstrap is the job's
    threading_bootstrap = dict(reader["frames"][0], name="_bootstrap", filename="/py/threading.py")
    job["frames"] = reader["frames"][:2] + [threading_bootstrap]
    assert not is_agent_thread(job)
