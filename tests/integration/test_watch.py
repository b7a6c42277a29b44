"""The agent's `watch` (agent/watch.py): a window of stack samples taken by the agent itself,
each with its threads' CPU ticks and wake-ups from its own /proc, in one reply: what `hang` asks
of a rank on another node, directly or through its node's relay, instead of a backtrace and a
python.threads table per sample."""

from __future__ import annotations

import time
from typing import Any, Dict, Iterator, List

import pytest

from probing.client.connection import Client
from probing.client.discovery import locate_socket
from probing.client.replies import decode_reply_table
from probing.errors import RequestRefused
from probing.procfs import thread_cpu_ticks
from probing.protocol.messages import parse_reply

from support import Target


@pytest.fixture(scope="module")
def sleeper() -> Iterator[Target]:
    with Target("sleeper.py") as target:
        yield target


def watch(target: Target, params: Dict[str, Any]) -> Any:
    with Client(locate_socket(target.pid), 30, pid=target.pid) as client:
        return client.call("watch", params, timeout=30)


def test_each_sample_has_every_thread_its_counters_and_its_time(sleeper: Target) -> None:
    started = time.monotonic()
    result, payload = watch(sleeper, {"duration": 1.0, "samples": 3})
    took = time.monotonic() - started
    assert 1.0 <= took < 3.0, took
    rows = decode_reply_table(result, payload).to_rows()
    samples: List[Dict[str, Any]] = result["samples"]
    assert result["pid"] == sleeper.pid and len(samples) == 3
    assert [round(sample["taken"], 1) for sample in samples] == [0.0, 0.5, 1.0]
    for sample in samples:
        start, end = sample["rows"]
        taken = rows[start:end]
        assert {row["thread_name"] for row in taken} == {"MainThread", "worker"}  # no agent thread
        assert {str(row["native_id"]) for row in taken} == set(sample["counters"])
        for native, (ticks, wakeups) in sample["counters"].items():
            assert isinstance(ticks, int) and isinstance(wakeups, int), (native, ticks, wakeups)
    assert samples[-1]["rows"][1] == len(rows)
    main = next(row["native_id"] for row in rows if row["thread_name"] == "MainThread")
    # The same counter `hang` reads for a process of this machine (engine/hang.py take_sample).
    last = samples[-1]["counters"][str(main)][0]
    assert last <= (thread_cpu_ticks(sleeper.pid, main) or 0)


@pytest.mark.parametrize(
    "params, why",
    [
        ({"duration": 1.0, "samples": 1}, "samples must be an integer >= 2"),
        ({"duration": 1.0, "samples": 101}, "samples must be at most 100"),
        ({"duration": -1.0, "samples": 3}, "duration must be a number from 0 to 600"),
        ({"duration": "10", "samples": 3}, "duration must be a number"),
    ],
)
def test_a_bad_window_is_refused_before_any_sample(sleeper: Target, params: Dict[str, Any], why: str) -> None:
    started = time.monotonic()
    with pytest.raises(RequestRefused, match=why):
        watch(sleeper, params)
    assert time.monotonic() - started < 1.0


def test_a_relay_watches_every_rank_of_its_node_at_once() -> None:
    """Each `watch` holds a relay thread for its window: 20 of them (more than the 16 threads
    a relay asks with) still end in about one window, not two."""
    targets: List[Target] = []
    try:
        for _ in range(20):
            targets.append(Target("sleeper.py"))
        calls = [{"pid": target.pid, "method": "watch", "params": {"duration": 2.0, "samples": 2}}
                 for target in targets]  # fmt: skip
        started = time.monotonic()
        with Client(locate_socket(targets[0].pid), 30, pid=targets[0].pid) as client:
            result, _ = client.call("relay", {"calls": calls, "timeout": 20}, timeout=30)
        took = time.monotonic() - started
        answered = [parse_reply(entry["reply"])[1] for entry in result["replies"] if "reply" in entry]
        assert answered == [True] * 20, result["replies"]
        assert took < 3.9, f"20 watches of 2 s took {took:.1f} s through one relay"
    finally:
        for target in targets:
            target.kill()
