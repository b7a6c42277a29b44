"""The look from outside while an agent starts (attach._EarlyLook): it sees the job's threads
from before the injection only, so the agent's own loader is never named the GIL's holder nor
shown in an answer (CI once answered a busy loop with the loader's thread in `read`)."""

from __future__ import annotations

import time
from typing import FrozenSet, List, Optional

import pytest

from probing.attach import _EarlyLook
from probing.errors import AttachTimeout
from probing.outside.pyspy import threads_among

JOB = frozenset({100, 101})


def test_threads_the_injection_started_are_left_out_and_unnumbered_ones_kept() -> None:
    threads = [{"os_thread_id": 100}, {"os_thread_id": 102, "thread_name": "loader"}, {"thread_name": "old"}]
    assert threads_among(threads, JOB) == [{"os_thread_id": 100}, {"thread_name": "old"}]
    assert threads_among(threads, None) == threads


class Looks:
    def __init__(self, holders: List[Optional[str]]) -> None:
        self.holders = holders
        self.among: List[FrozenSet[int]] = []

    def __call__(self, among: FrozenSet[int]) -> Optional[str]:
        self.among.append(among)
        return self.holders.pop(0)


def test_a_still_process_whose_only_holder_is_the_loader_is_waited_on_then_looked_at_once_more() -> None:
    looks = Looks([None, "thread 'MainThread' holds the GIL"])
    early = _EarlyLook(looks, lambda: "no thread runs", time.monotonic(), lambda _: None, JOB)
    early.check()  # still: one look, no holder among the job's threads
    early.check()  # still again, but that look was taken
    assert looks.among == [JOB]
    early.injected -= 1.0  # the 300 ms look is due
    with pytest.raises(AttachTimeout, match="MainThread"):
        early.check()
    assert looks.among == [JOB, JOB]
    early.check()  # and no look after that
    assert len(looks.among) == 2


def test_a_process_with_a_running_thread_is_not_looked_at_before_its_time() -> None:
    looks = Looks([])
    early = _EarlyLook(looks, lambda: None, time.monotonic(), lambda _: None, JOB)
    early.check()
    assert looks.among == []
