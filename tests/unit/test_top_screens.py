"""`top`'s pure parts: which rank comes first, what a screen says, the plain text cut to a width."""

from __future__ import annotations

import time

from probing.cli.render.top import job_screen, plain, process_screen
from probing.engine.jobs.job import Job
from probing.engine.top import (
    FIRST_SPAN_S,
    CpuClock,
    JobView,
    ProcessView,
    RankLine,
    ThreadLine,
    _behind_first,
)


def _rank(rank: int, enqueued: object = None, error: object = None, rate: object = None) -> RankLine:
    return RankLine(rank, 0, 100 + rank, 1.5, 300 * 2**20, enqueued, None if enqueued is None else 9, rate,
                    None if error else "running in step (train.py:3)", error)  # type: ignore[arg-type]  # fmt: skip


def test_a_rank_that_cannot_be_looked_at_comes_first_then_the_one_furthest_behind() -> None:
    lines = [_rank(0, 12), _rank(3, None), _rank(2, 10), _rank(1, 12, error="its agent did not answer")]
    assert [line.rank for line in sorted(lines, key=_behind_first)] == [1, 2, 0, 3]


def test_a_job_screen_names_the_rank_behind_and_says_what_it_does_not_know() -> None:
    job = Job("run-7", 4242, "127.0.0.1:29500", 4, [])
    silent = _rank(1, None, error="its agent did not answer")
    ranks = [_rank(2, 10, rate=0.0), _rank(0, 12, rate=25.0), silent]
    screen = job_screen(JobView(job, ranks, 14), 1.0, interactive=True)
    assert screen.heading == ["job run-7 · 3 of its 4 ranks on 1 node", screen.heading[1]]
    assert screen.heading[1].endswith("every 1 s · q quits")
    assert screen.rows[0][:7] == ["2", "0", "102", "1.5", "300 MB", "#10 / #9", "0.0"]
    assert screen.rows[0][7] == "running in step (train.py:3)"
    assert screen.rows[2][5:] == ["-", "-", "[not looked at: its agent did not answer]"]
    assert screen.footer[0].endswith("; behind the others: rank 2")
    text = plain(job_screen(JobView(job, ranks, 14), 0.5, interactive=False))
    assert "q quits" not in text and "every 0.5 s" in text


def test_a_process_screen_and_its_plain_text_cut_to_the_terminal() -> None:
    threads = [
        ThreadLine("MainThread", 1, True, 97.0, "running Python", "forward (model.py:44) from run (t.py:9)"),
        ThreadLine("pin_memory", 2, False, None, "waiting on a queue", "get (queue.py:171)"),
    ]
    view = ProcessView(4242, "python train.py", None, 5 * 2**30, "py-spy", threads, ["read from outside"])
    screen = process_screen(view, 2.0, interactive=False)
    assert screen.heading[1].startswith("CPU - · RSS 5.0 GB · 2 threads · stacks from py-spy · ")
    assert screen.rows[1] == ["pin_memory", "-", "waiting on a queue", "get (queue.py:171)"]
    lines = plain(screen, width=40).splitlines()
    assert all(len(line) <= 40 for line in lines)
    assert lines[4].startswith("MainThread  97.0  running Python") and lines[4].endswith("...")


def test_cpu_is_known_from_the_second_reading_on() -> None:
    clock = CpuClock()
    assert clock.percent("t", 1.0) is None and clock.percent("t", None) is None
    time.sleep(0.05)
    used = clock.percent("t", 1.025)
    assert used is not None and 20 < used < 60


def test_a_primed_clock_has_figures_at_the_first_refresh_after_a_quarter_second() -> None:
    clock = CpuClock()
    clock.prime([("t", 1.0), ("gone", None)])
    started = time.monotonic()
    clock.settle()
    assert time.monotonic() - started >= FIRST_SPAN_S - 0.01
    used = clock.percent("t", 1.1)
    assert used is not None and 10 < used < 45, used
    assert clock.percent("gone", 3.0) is None  # nothing read when primed: known from the next on
    started = time.monotonic()
    clock.settle()  # once only
    assert time.monotonic() - started < 0.05


def test_what_the_job_named_cannot_act_on_the_terminal() -> None:
    hostile = ThreadLine("\x1b]0;owned\x07\x1b[2J", 1, True, 1.0, "running Python", "f (\x1b[31mx.py:1)")
    view = ProcessView(7, "python \x1b[2Jtrain.py", 1.0, 2**20, "agent", [hostile], ["a note \x1b[H"])
    text = plain(process_screen(view, 1.0, interactive=True))
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[2J" in text and "f (\\x1b[31mx.py:1)" in text
