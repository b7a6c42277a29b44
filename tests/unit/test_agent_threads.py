"""agent/threads.py: the agent's threads are not threading's, and nothing they raise reaches the
job's hooks. In this process: the agent runs here as it would in a job."""

from __future__ import annotations

import sys
import threading
from typing import Any, List

import pytest

from probing.agent import threads
from probing.agent.threads import AgentThread, forget_dummy, job_thread
from probing.originals import Event


def test_an_agent_thread_is_not_threadings_and_ends_joined() -> None:
    seen: List[Any] = []
    before = threading.active_count()

    def look() -> None:
        seen.append((threading.active_count(), job_thread(), threading.get_ident() in threading._active))  # type: ignore[attr-defined]

    thread = AgentThread(target=look, name="probing-test")
    thread.start()
    thread.join(10)
    assert seen == [(before, None, False)]
    assert not thread.is_alive() and thread.ident is not None and thread.native_id is not None
    with pytest.raises(RuntimeError):
        thread.start()  # once only, as threading's


def test_what_an_agent_thread_raises_reaches_no_hook_of_the_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    called: List[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda *args: called.append("unraisable"))
    monkeypatch.setattr(threading, "excepthook", lambda *args: called.append("thread"))

    def fail() -> None:
        raise SystemError("the agent's own mistake")

    thread = AgentThread(target=fail, name="probing-failing")
    thread.start()
    thread.join(10)
    assert called == []
    assert threads.errors[-1] == "probing-failing: SystemError: the agent's own mistake"


def test_a_dummy_thread_made_by_code_the_agent_ran_is_forgotten() -> None:
    made = Event()

    def run_the_jobs_code() -> None:
        threading.current_thread()  # what logging does: registers a _DummyThread
        made.set()
        forget_dummy(threading.get_ident())

    before = threading.active_count()
    thread = AgentThread(target=run_the_jobs_code, name="probing-eval-0")
    thread.start()
    thread.join(10)
    assert made.is_set() and threading.active_count() == before
    assert not [t for t in threading.enumerate() if isinstance(t, threading._DummyThread)]  # type: ignore[attr-defined]


def test_the_agents_event_waits_and_times_out() -> None:
    event = Event()
    assert event.wait(0.01) is False
    AgentThread(target=event.set, name="probing-setter").start()
    assert event.wait(10) is True and event.is_set()
    event.clear()
    assert not event.is_set() and event.wait(0) is False
