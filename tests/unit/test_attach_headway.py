"""What the CLI counts as an agent load making headway (probing/attach `_Loading`).

A load after a detach reads no file: its loader waits, using no CPU, while each thread it
starts gets the GIL, and a job that holds the GIL for long stretches (a gc.collect() loop)
made one such load look stuck (CI: given up after 5 s). The threads the loader started count as
its headway. Real threads of a real process, named as the helper and the agent name theirs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Iterator

import pytest

import probing.attach as attach

# A process whose threads take the names the helper and the agent give theirs, on command:
# `loader` (one that then idles), `worker` (one that then works on, in CPU and reads).
_JOB = r"""
import os, sys, threading, time

def named(name):
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
        comm.write(name)

def loader():
    named("probing-agent")
    threading.Event().wait()

def worker():
    named("probing-memory")
    while True:
        sum(range(20000))
        with open("/proc/self/stat", "rb") as stat:
            stat.read()
        time.sleep(0.005)

print("ready", flush=True)
for line in sys.stdin:
    threading.Thread(target={"loader": loader, "worker": worker}[line.strip()], daemon=True).start()
    time.sleep(0.1)
    print("started", flush=True)
"""


@pytest.fixture
def job() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", _JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def start(job: subprocess.Popen[str], what: str) -> None:
    assert job.stdin is not None and job.stdout is not None
    job.stdin.write(what + "\n")
    job.stdin.flush()
    assert job.stdout.readline() == "started\n"


def watch(loading: attach._Loading, seconds: float) -> bool:
    """Look as attach() does for `seconds`; whether the load still counts as moving."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        loading.look()
        time.sleep(0.02)
    loading.look()
    return loading.moving()


def test_a_loader_that_does_nothing_stalls(
    job: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attach, "_STALLED_S", 0.5)
    loading = attach._Loading(job.pid)
    start(job, "loader")
    assert watch(loading, 0.2), "a loader that just appeared has made headway"
    assert not watch(loading, 1.0), "a loader idle for longer than _STALLED_S is stuck"
    assert loading.last, "the loader was seen: the error says it got the GIL"


def test_the_threads_the_loader_started_are_its_headway(
    job: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attach, "_STALLED_S", 0.5)
    loading = attach._Loading(job.pid)
    start(job, "loader")
    start(job, "worker")
    assert watch(loading, 1.5), "the sampler the loader started works: the load is moving"


def test_an_older_agents_threads_are_not_this_loads_headway(
    job: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attach, "_STALLED_S", 0.5)
    start(job, "worker")  # an earlier agent's sampler, working before this attach began
    loading = attach._Loading(job.pid)
    start(job, "loader")
    assert not watch(loading, 1.5), "only threads that appeared after the injection count"
