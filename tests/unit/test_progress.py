"""The one definition of progress (analysis/progress.py), judged from fake Samples: no process.

Counters are (CPU ticks, voluntary context switches) per native thread id; one tick is
1/SC_CLK_TCK s, so 10 s of samples with 0 ticks is 0 % and with CLK_TCK ticks is 10 %.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

from probing.analysis.carriers import named, unmatched
from probing.analysis.progress import (
    ProgressTracker,
    Sample,
    stuck_dataloader_worker,
    verdict,
)
from probing.engine import hang as hang_engine
from probing.engine.hang import watch

PID = 100
CLOCK = os.sysconf("SC_CLK_TCK")
Frame = Tuple[str, str, int]  # func, file, line; innermost first
LINES = {
    ("train.py", 10): "loss = step(batch)",
    ("train.py", 11): "optimizer.step()",
    ("train.py", 20): "time.sleep(0.1)",
    ("train.py", 30): "libc.sleep(600)",
    ("train.py", 40): "result = compute()",
}


def code_line(frame: Dict[str, Any]) -> str:
    return LINES.get((os.path.basename(str(frame["file"])), frame["lineno"]), "")


def rows(threads: Dict[int, Sequence[Frame]], source: str = "agent") -> List[Dict[str, Any]]:
    """python.backtrace rows: thread `PID` is the main thread, the others are named T<id>."""
    out = []
    for native, frames in threads.items():
        for depth, (func, file, line) in enumerate(frames):
            out.append(
                {
                    "pid": PID, "thread_id": native * 10, "native_id": native,
                    "thread_name": "MainThread" if native == PID else f"T{native}",
                    "is_main": native == PID, "depth": depth, "func": func, "file": file,
                    "lineno": line, "frame_type": "Python", "locals": None, "source": source,
                }
            )  # fmt: skip
    return out


def sample(
    taken: float,
    threads: Dict[int, Sequence[Frame]],
    counters: Optional[Dict[int, Tuple[int, int]]] = None,
    source: str = "agent",
    gil_holder: Optional[int] = None,
) -> Sample:
    counts = {native: (0, 0) for native in threads}
    counts.update(counters or {})
    return Sample(taken, rows(threads, source), dict(counts), gil_holder)  # type: ignore[arg-type]


STEP = [("step", "/job/train.py", 10), ("<module>", "/job/train.py", 50)]
OPTIMIZE = [("step", "/job/train.py", 11), ("<module>", "/job/train.py", 50)]
SLEEPS = [("poll", "/job/train.py", 20), ("<module>", "/job/train.py", 50)]
COMPUTES = [("compute", "/job/train.py", 40), ("<module>", "/job/train.py", 50)]
HOLDS_GIL = [("hold", "/job/train.py", 30), ("run", "/usr/lib/python3.11/threading.py", 982)]
JOINS = [
    ("_wait_for_tstate_lock", "/usr/lib/python3.11/threading.py", 1132),
    ("join", "/usr/lib/python3.11/threading.py", 1112),
    ("<module>", "/job/train.py", 60),
]
LOCKED = [("acquire", "/job/train.py", 70), ("<module>", "/job/train.py", 50)]


def judge(*samples: Sample) -> Any:
    return verdict(PID, list(samples), code_line)


def test_a_main_thread_whose_stack_changes_progresses() -> None:
    report = judge(sample(0, {PID: STEP}), sample(1, {PID: OPTIMIZE}))
    assert not report.hung and report.threads[0].activity == "moved" and report.threads[0].moved


def test_a_main_thread_stuck_on_a_lock_is_hung_whatever_a_heartbeat_thread_does() -> None:
    heartbeat = 7
    report = judge(
        sample(0, {PID: LOCKED, heartbeat: STEP}),
        sample(10, {PID: LOCKED, heartbeat: OPTIMIZE}),
    )
    assert report.hung
    main = report.threads[0]
    assert main.is_main and main.activity == "still" and main.state == "waiting in Lock.acquire"
    assert "'MainThread'" in report.reason


def test_one_place_with_cpu_is_busy_not_hung() -> None:
    report = judge(
        sample(0, {PID: COMPUTES}, {PID: (0, 0)}), sample(10, {PID: COMPUTES}, {PID: (CLOCK * 5, 0)})
    )
    assert not report.hung and report.threads[0].activity == "busy" and not report.threads[0].moved


def test_waking_up_on_a_wait_line_is_looping_not_progress() -> None:
    """A loop that polls a flag with time.sleep never gets what it waits for."""
    report = judge(sample(0, {PID: SLEEPS}, {PID: (0, 0)}), sample(10, {PID: SLEEPS}, {PID: (0, 500)}))
    main = report.threads[0]
    assert report.hung and main.activity == "looping" and not main.moved and main.state == "sleeping"
    assert "only woke up to wait again" in report.reason


def test_waking_up_on_a_wait_line_and_working_in_between_is_progress() -> None:
    """A training step, then time.sleep: every sample catches the sleep, the CPU says it works."""
    report = judge(
        sample(0, {PID: SLEEPS}, {PID: (0, 0)}), sample(10, {PID: SLEEPS}, {PID: (CLOCK * 3, 900)})
    )
    assert not report.hung and report.threads[0].activity == "moved"


def test_waking_up_inside_one_call_that_is_not_a_wait_is_progress() -> None:
    report = judge(sample(0, {PID: COMPUTES}, {PID: (0, 0)}), sample(10, {PID: COMPUTES}, {PID: (0, 500)}))
    assert not report.hung and report.threads[0].activity == "moved"


def test_wake_ups_read_while_py_spy_sampled_are_not_counted() -> None:
    """py-spy stops every thread it reads, which wakes it up: those wake-ups are its own."""
    report = judge(
        sample(0, {PID: COMPUTES}, {PID: (0, 0)}, source="py-spy"),
        sample(3, {PID: COMPUTES}, {PID: (0, 40)}, source="py-spy"),
    )
    assert report.hung and report.threads[0].activity == "still"


def test_the_same_stack_read_by_the_agent_and_by_py_spy_has_not_moved() -> None:
    """Samples alternate between the agent and py-spy when the agent answers only sometimes;
    the two may name a frame differently, so only samples read the same way are compared."""
    spy_view = [("step", "/elsewhere/train.py", 10), ("<module>", "/elsewhere/train.py", 51)]
    report = judge(
        sample(0, {PID: LOCKED}),
        sample(1, {PID: spy_view}, source="py-spy"),
        sample(2, {PID: LOCKED}),
        sample(3, {PID: spy_view}, source="py-spy"),
    )
    assert report.hung and report.threads[0].activity == "still"


def test_a_thread_holding_the_gil_without_moving_hangs_the_process() -> None:
    """The issue's core scenario: the holder sleeps in C with the GIL, the main thread waits for
    it and keeps waking up to ask for the GIL; nothing can move."""
    holder = 101
    samples = [
        sample(t, {PID: JOINS, holder: HOLDS_GIL}, {PID: (0, 200 * t), holder: (0, 12 * t)}, "py-spy", holder)
        for t in range(4)
    ]
    report = judge(*samples)
    assert report.hung, report
    by_name = {thread.name: thread for thread in report.threads}
    assert by_name[f"T{holder}"].holds_gil and by_name[f"T{holder}"].state == "holds the GIL, sleeping"
    assert not by_name[f"T{holder}"].moved and not by_name["MainThread"].moved
    assert "held the GIL" in report.reason and report.to_json()["reason"] == report.reason


def test_a_thread_holding_the_gil_while_computing_is_busy() -> None:
    holder = 101
    samples = [
        sample(t, {PID: JOINS, holder: HOLDS_GIL}, {holder: (CLOCK * t, 0)}, "py-spy", holder)
        for t in range(3)
    ]
    report = judge(*samples)
    assert not report.hung and "busy" in report.reason


def test_the_gil_seen_free_once_is_not_held_forever() -> None:
    holder = 101
    report = judge(
        sample(0, {PID: JOINS, holder: HOLDS_GIL}, source="py-spy", gil_holder=holder),
        sample(1, {PID: JOINS, holder: HOLDS_GIL}, source="agent", gil_holder=None),
    )
    assert not any(thread.holds_gil for thread in report.threads)


def test_a_main_thread_joining_workers_progresses_with_them() -> None:
    worker = 102
    report = judge(sample(0, {PID: JOINS, worker: STEP}), sample(1, {PID: JOINS, worker: OPTIMIZE}))
    assert not report.hung and f"'T{worker}' moved" in report.reason
    report = judge(sample(0, {PID: JOINS, worker: LOCKED}), sample(1, {PID: JOINS, worker: LOCKED}))
    assert report.hung


DATALOADER_MAIN = [
    ("select", "/usr/lib/python3.11/selectors.py", 415),
    ("wait", "/usr/lib/python3.11/multiprocessing/connection.py", 947),
    ("get", "/usr/lib/python3.11/multiprocessing/queues.py", 113),
    ("_try_get_data", "/venv/torch/utils/data/dataloader.py", 1133),
    ("_get_data", "/venv/torch/utils/data/dataloader.py", 1295),
    ("<module>", "/job/train.py", 50),
]


def test_a_dataloader_main_thread_waiting_for_a_batch_is_hung_even_polling() -> None:
    """Its queue get wakes up every 5 s (MP_STATUS_CHECK_INTERVAL) to check the workers."""
    report = judge(sample(0, {PID: DATALOADER_MAIN}), sample(10, {PID: DATALOADER_MAIN}, {PID: (0, 45)}))
    main = report.threads[0]
    assert report.hung and main.state == "waiting for a DataLoader worker" and main.activity == "looping"


def test_the_stuck_dataloader_worker_is_the_one_in_getitem() -> None:
    idle = rows({PID: [("_worker_loop", "/venv/torch/utils/data/_utils/worker.py", 334)]})
    stuck = rows(
        {PID: [("wait", "/usr/lib/python3.11/threading.py", 327), ("__getitem__", "/job/data.py", 15)]}
    )
    stuck[1]["locals"] = '{"self": "<Stuck>", "index": "5"}'
    assert stuck_dataloader_worker({200: idle}) is None
    found = stuck_dataloader_worker({200: idle, 201: stuck})
    assert found == {"pid": 201, "where": "__getitem__ (data.py:15)", "index": "5"}


WORKER = 102


def test_a_main_thread_that_only_sleeps_in_a_loop_hands_the_process_to_the_threads_it_supervises() -> None:
    """`while True: time.sleep(1)` in the main thread, training in a worker: the main thread wakes
    about once a second (fewer than WAKEUPS_PER_S) and is looping, not still; the worker decides."""
    report = judge(
        sample(0, {PID: SLEEPS, WORKER: COMPUTES}, {WORKER: (0, 0)}),
        sample(10, {PID: SLEEPS, WORKER: COMPUTES}, {PID: (0, 12), WORKER: (CLOCK * 9, 0)}),
    )
    main, worker = report.threads
    assert not report.hung, report.reason
    assert main.activity == "looping" and worker.activity == "busy"
    assert report.reason.startswith(f"thread 'T{WORKER}' was busy")
    assert "the main thread only loops on a wait (sleeping): the threads it supervises carry" in report.reason
    assert main.carries and worker.carries and report.to_json()["threads"][1]["carries"] is True


def test_a_main_thread_polling_every_tenth_of_a_second_while_a_worker_moves_progresses() -> None:
    report = judge(
        sample(0, {PID: SLEEPS, WORKER: STEP}), sample(10, {PID: SLEEPS, WORKER: OPTIMIZE}, {PID: (0, 100)})
    )
    assert not report.hung and report.reason.startswith(f"thread 'T{WORKER}' moved;"), report.reason


def test_a_supervisor_whose_workers_are_stuck_is_hung_and_names_them() -> None:
    stuck_in_c = 103  # libc.sleep without the GIL: a wait line, never woken
    samples = [
        sample(t, {PID: SLEEPS, WORKER: LOCKED, stuck_in_c: HOLDS_GIL[:1]}, {PID: (0, 12 * t)})
        for t in range(3)
    ]
    report = judge(*samples)
    assert report.hung
    assert report.reason.startswith(
        f"no thread that carries the process moved ('MainThread', 'T{WORKER}', 'T103')"
    )
    assert "'MainThread' only woke up to wait again" in report.reason
    assert [thread.activity for thread in report.threads] == ["looping", "still", "still"]
    assert all(thread.carries for thread in report.threads)


def test_a_main_thread_blocked_in_one_wait_decides_alone_and_the_verdict_names_what_moved() -> None:
    """One wake-up in 10 s (a stray signal) is not a loop: the main thread is stuck on its lock,
    whatever the other thread does, and the verdict says how to name that thread if it is the job."""
    heartbeat = 7
    report = judge(
        sample(0, {PID: LOCKED, heartbeat: STEP}),
        sample(10, {PID: LOCKED, heartbeat: OPTIMIZE}, {PID: (0, 1)}),
    )
    assert report.hung and report.threads[0].activity == "still"
    assert report.reason == (
        "no thread that carries the process moved ('MainThread'); 'T7' progressed: if it carries the job, "
        "say so with --thread T7"
    )
    assert [thread.carries for thread in report.threads] == [True, False]


def test_a_main_thread_polling_another_process_is_not_answered_by_its_own_threads() -> None:
    """A DataLoader main thread loops on its queue for a worker process: a heartbeat thread of its
    own that moves does not make the stuck DataLoader look alive."""
    heartbeat = 7
    report = judge(
        sample(0, {PID: DATALOADER_MAIN, heartbeat: STEP}),
        sample(10, {PID: DATALOADER_MAIN, heartbeat: OPTIMIZE}, {PID: (0, 45)}),
    )
    assert report.hung and report.threads[0].activity == "looping"
    assert "moved ('MainThread'); 'MainThread' only woke up to wait again; 'T7' progressed" in report.reason


def test_wake_ups_count_over_the_agents_run_of_samples_after_one_read_from_outside() -> None:
    """The first `hang` on a job attaches, and its first sample is often py-spy's while the agent
    comes up (a worker holds the GIL): the samples the agent gave after it still show the
    supervising main thread looping; a py-spy sample between them ends a run."""
    threads = {PID: SLEEPS, WORKER: COMPUTES}
    samples = [sample(0, threads, {PID: (0, 0)}, source="py-spy")]
    samples += [sample(t, threads, {PID: (0, 5 + 2 * t), WORKER: (CLOCK * t, 0)}) for t in range(1, 5)]
    report = judge(*samples)
    assert not report.hung and report.threads[0].activity == "looping", report.reason
    assert report.threads[0].wakeups_per_s == 2.0
    broken = [samples[1], samples[2]._replace(rows=rows(threads, "py-spy")), samples[3], samples[4]]
    assert judge(*broken).threads[0].wakeups_per_s == 2.0  # the run of the last two


def test_the_threads_named_by_the_user_alone_decide() -> None:
    """--thread: a worker that moves carries a main thread blocked for good, and a stuck worker
    is the verdict even while another worker computes; names may be globs."""
    loader = 103
    blocked = [sample(t, {PID: LOCKED, WORKER: STEP if t % 2 else OPTIMIZE}) for t in range(3)]
    assert judge(*blocked).hung
    report = verdict(PID, blocked, code_line, ["T102"])
    assert not report.hung
    assert report.reason == f"thread 'T{WORKER}' moved; the threads named by --thread T102 carry the process"
    assert [thread.carries for thread in report.threads] == [False, True]
    working = [
        sample(t, {PID: SLEEPS, WORKER: LOCKED, loader: STEP if t % 2 else OPTIMIZE}, {PID: (0, 12 * t)})
        for t in range(3)
    ]
    assert not judge(*working).hung
    report = verdict(PID, working, code_line, ["T10[2]", "nothing-*"])
    assert report.hung and report.reason.startswith("no thread that carries the process moved ('T102');")
    assert "'T103' progressed" in report.reason


def test_named_threads_not_there_leave_the_rule_to_decide_and_say_so() -> None:
    """The watchdog sees a job before it starts its threads, and after they end."""
    report = verdict(PID, [sample(0, {PID: STEP}), sample(1, {PID: OPTIMIZE})], code_line, ["trainer"])
    assert not report.hung
    assert report.reason == (
        "thread 'MainThread' moved; no thread named by --thread trainer was seen (threads: 'MainThread'), "
        "so the main thread carries the process"
    )


def test_names_and_globs_match_thread_names() -> None:
    assert named("worker-3", ["worker-*"]) and named("[x]", ["[x]"])
    assert not named("Worker-3", ["worker-*"])
    assert unmatched(["worker", "io-*", "main"], ["MainThread", "worker", "io-0"]) == ["main"]


def test_the_watchdog_tracker_takes_the_named_threads_too() -> None:
    tracker = ProgressTracker(PID, code_line, ["T102"])
    for t in range(4):
        report = tracker.add(sample(t, {PID: LOCKED, WORKER: STEP if t % 2 else OPTIMIZE}))
    assert not report.hung and tracker.stalled_s(3) == 0.0


def test_the_watchdog_rolling_window_agrees_with_hang_on_the_same_samples() -> None:
    """ProgressTracker (probing run --hang-timeout) and verdict (probing PID hang) share the
    definition: fed the same samples, the tracker's last verdict is hang's."""
    holder = 101
    scenarios = {
        "moved": [sample(t, {PID: STEP if t % 2 else OPTIMIZE}) for t in range(4)],
        "lock": [sample(t, {PID: LOCKED}) for t in range(4)],
        "looping": [sample(t, {PID: SLEEPS}, {PID: (0, 100 * t)}) for t in range(4)],
        "busy": [sample(t, {PID: COMPUTES}, {PID: (CLOCK * t, 0)}) for t in range(4)],
        "gil": [
            sample(t, {PID: JOINS, holder: HOLDS_GIL}, {PID: (0, 200 * t)}, "py-spy", holder)
            for t in range(4)
        ],
    }
    for name, samples in scenarios.items():
        tracker = ProgressTracker(PID, code_line)
        rolling = [tracker.add(taken) for taken in samples][-1]
        whole = judge(*samples)
        assert rolling.hung == whole.hung, name
        assert [t.activity for t in rolling.threads] == [t.activity for t in whole.threads], name
        assert tracker.stalled_s(samples[-1].taken) == (3.0 if whole.hung else 0.0), name


class FakeClock:
    """progress.py's `time`: sleeping and sampling advance it, nothing waits."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _timed_samples(clock: FakeClock, each_s: float) -> Tuple[List[float], Any]:
    """A sampler that takes `each_s` seconds a sample (a job of thousands of threads, or a
    loaded machine), and the times its samples began."""
    began: List[float] = []

    def take() -> Sample:
        began.append(clock.now)
        clock.now += each_s
        return sample(began[-1], {PID: LOCKED})

    return began, take


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(hang_engine, "time", fake)
    return fake


def test_samples_are_spread_over_the_window(clock: FakeClock) -> None:
    began, take = _timed_samples(clock, 0.01)
    report = watch(PID, take, 0.4, 5, code_line)
    assert report.samples == 5
    assert [round(at - 1000.0, 3) for at in began] == [0.0, 0.1, 0.2, 0.3, 0.4]


def test_a_late_sample_still_has_the_rest_follow(clock: FakeClock) -> None:
    """A loaded machine: the sample of the slot before the last ends past the window, but not
    past the next slot. All five are taken, as `hang`'s documented output counts them."""
    durations = iter([0.01, 0.01, 0.01, 0.6, 0.01])
    began: List[float] = []

    def take() -> Sample:
        began.append(clock.now)
        clock.now += next(durations)
        return sample(began[-1], {PID: LOCKED})

    assert watch(PID, take, 2.0, 5, code_line).samples == 5


def test_slow_samples_are_fewer_not_late(clock: FakeClock) -> None:
    """Five samples asked over 2 s, each taking 1.5 s (5000 threads): the check stops at the
    first to end past the window and its next slot (3 s, not 7.5 s), and still judges."""
    began, take = _timed_samples(clock, 1.5)
    report = watch(PID, take, 2.0, 5, code_line)
    assert report.samples == len(began) == 2 and report.hung
    assert clock.now - 1000.0 == 3.0
    began, take = _timed_samples(clock, 5.0)  # one sample alone longer than the window: still two
    assert watch(PID, take, 2.0, 5, code_line).samples == 2
