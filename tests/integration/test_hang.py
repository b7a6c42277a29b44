"""`probing PID hang` and the CI watchdog `probing run --hang-timeout`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from probing.errors import ExitCode

from support import PROBING, TARGETS, VENV_PYTHON, Target, TorchrunJob, probing, wait_until


def test_two_threads_deadlocked_are_reported_hung() -> None:
    with Target("deadlock.py", via="plain") as job:
        result = probing(str(job.pid), "hang", "--duration", "1.5", "--samples", "4")
        assert result.returncode == ExitCode.HUNG, result.stderr
        assert f"PID {job.pid} is hung: no thread that carries the process moved (" in result.stdout
        lines = {line.split()[0]: line for line in result.stdout.splitlines()[3:] if line.strip()}
        for name in ("takes-first", "takes-second"):
            assert " still " in lines[name] and "blocked entering `with theirs:`" in lines[name]
        report = json.loads(probing(str(job.pid), "hang", "--duration", "1", "--format", "json").stdout)
        assert report["hung"] is True and report["samples"] == 10
        assert {thread["name"] for thread in report["threads"]} == {
            "MainThread",
            "takes-first",
            "takes-second",
        }


def test_a_healthy_training_loop_is_not_hung() -> None:
    pytest.importorskip("torch")
    with Target("trainer.py", via="plain") as job:
        result = probing(str(job.pid), "hang", "--duration", "2", "--samples", "8")
        assert result.returncode == ExitCode.OK, result.stdout + result.stderr
        assert "is progressing: thread 'MainThread' moved" in result.stdout


def test_the_watchdog_ends_a_job_that_deadlocks(tmp_path: Path) -> None:
    report = tmp_path / "hang.json"
    started = time.monotonic()
    result = subprocess.run(
        [PROBING, "run", "--hang-timeout", "5", "--report", str(report), "--",
         VENV_PYTHON, str(TARGETS / "deadlocks_later.py")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert time.monotonic() - started < 15
    assert result.returncode == ExitCode.HUNG, result.stderr
    assert "the job made no progress for 5 s" in result.stderr
    assert 'File "' in result.stderr and "lock.acquire()  # never returns" in result.stderr
    saved = json.loads(report.read_text())
    assert saved["hung"] is True and saved["processes"][0]["frames"]


@pytest.mark.parametrize("verbose", [[], ["-v"]], ids=["quiet", "verbose"])
def test_the_watchdog_ends_the_job_when_its_reader_went_away(tmp_path: Path, verbose: List[str]) -> None:
    """`probing run --hang-timeout S -- ... 2>&1 | head`: the reader is gone before the verdict
    is written (with -v, before the watchdog's next look). The JSON report is still written, the
    job still ended, and the exit is 11."""
    report = tmp_path / "hang.json"
    command = [PROBING, *verbose, "run", "--hang-timeout", "3", "--report", str(report), "--",
               VENV_PYTHON, str(TARGETS / "deadlocks_later.py")]  # fmt: skip
    runner = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert runner.stderr is not None
    first = runner.stderr.readline()  # "probing: started PID N: ..."; then the reader leaves
    runner.stderr.close()
    child = int(first.split("started PID ")[1].split(":")[0])
    try:
        assert runner.wait(timeout=60) == ExitCode.HUNG
        ended = wait_until(lambda: not os.path.exists(f"/proc/{child}"), 10, 0.1)
        assert ended, "the hung job was left running"
    finally:
        if runner.poll() is None:
            runner.kill()
        if os.path.exists(f"/proc/{child}"):
            os.kill(child, signal.SIGKILL)
    assert json.loads(report.read_text())["hung"] is True


def test_a_report_that_fails_late_still_leaves_the_stacks_and_exit_11(tmp_path: Path) -> None:
    """The report's directory was there at the start and is gone when the job hangs: stderr
    says so, then gives the stacks as always."""
    directory = tmp_path / "reports"
    directory.mkdir()
    command = [PROBING, "run", "--hang-timeout", "3", "--report", str(directory / "hang.json"), "--",
               VENV_PYTHON, str(TARGETS / "deadlocks_later.py")]  # fmt: skip
    runner = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert runner.stderr is not None
    first = runner.stderr.readline()
    directory.rmdir()
    try:
        rest = runner.stderr.read()
        assert runner.wait(timeout=60) == ExitCode.HUNG, first + rest
    finally:
        if runner.poll() is None:
            runner.kill()
    assert f"probing: no report: cannot write {directory / 'hang.json'}" in rest, rest
    assert "lock.acquire()  # never returns" in rest


def test_the_watchdog_passes_a_finished_jobs_status_through() -> None:
    job = [VENV_PYTHON, "-c", "import time, sys; time.sleep(1); sys.exit(3)"]
    result = subprocess.run(
        [PROBING, "run", "--hang-timeout", "5", "--", *job], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3, result.stderr


def test_a_thread_holding_the_gil_forever_is_hung_and_named() -> None:
    """The issue's core scenario: one thread sleeps in C holding the GIL, the main thread waits
    for it. The holder can only say "ready" before its C call: the test then waits, bounded,
    until py-spy sees it holding the GIL."""
    from probing.outside.pyspy import dump

    with Target("gil_held_join.py", via="plain") as job:

        def holds() -> bool:
            return any(t.get("owns_gil") and t.get("thread_name") == "gil-holder" for t in dump(job.pid))

        assert wait_until(holds, timeout=10, interval=0.1)
        result = probing(str(job.pid), "hang", "--duration", "3")
        assert result.returncode == ExitCode.HUNG, result.stdout + result.stderr
        assert f"PID {job.pid} is hung" in result.stdout
        holder = next(line for line in result.stdout.splitlines() if line.startswith("gil-holder"))
        assert " still " in holder and "holds the GIL, sleeping" in holder, result.stdout
        report = json.loads(probing(str(job.pid), "hang", "--duration", "1", "--format", "json").stdout)
        assert report["hung"] is True and "held the GIL" in report["reason"]
        by_name = {thread["name"]: thread for thread in report["threads"]}
        assert by_name["gil-holder"]["holds_gil"] is True and by_name["gil-holder"]["moved"] is False
        assert by_name["MainThread"]["moved"] is False


def test_a_loop_that_only_wakes_up_to_sleep_again_is_looping_not_moving() -> None:
    with Target("polls_forever.py", via="plain") as job:
        result = probing(str(job.pid), "hang", "--duration", "2", "--samples", "5", "--format", "json")
        report = json.loads(result.stdout)
        assert result.returncode == ExitCode.HUNG, result.stdout + result.stderr
        main = next(thread for thread in report["threads"] if thread["is_main"])
        assert main["activity"] == "looping" and main["moved"] is False and main["state"] == "sleeping"
        assert main["wakeups_per_s"] > 20


def test_the_watchdog_ends_a_job_whose_thread_holds_the_gil(tmp_path: Path) -> None:
    """The watchdog judges progress as `hang` does (analysis/progress.py): the GIL held forever
    is no progress, whatever the waiting threads' wake-ups say."""
    result = subprocess.run(
        [PROBING, "run", "--hang-timeout", "4", "--", VENV_PYTHON, str(TARGETS / "gil_held_join.py")],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert result.returncode == ExitCode.HUNG, result.stderr
    assert "holds the GIL" in result.stderr


def test_a_main_thread_blocked_opening_a_fifo_reads_as_opening_a_file(tmp_path: Path) -> None:
    """`with open(...)` on the innermost line is the open() call not returning, not a lock."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with Target("opens_fifo.py", via="plain", args=[str(fifo)]) as job:
        # "ready" comes before the open: wait until the main thread is inside openat (257).
        assert wait_until(lambda: Path(f"/proc/{job.pid}/syscall").read_text().startswith("257 "), timeout=10)
        result = probing(str(job.pid), "hang", "--duration", "1", "--samples", "3", "--format", "json")
        assert result.returncode == ExitCode.HUNG, result.stdout + result.stderr
        main = next(thread for thread in json.loads(result.stdout)["threads"] if thread["is_main"])
        assert main["state"] == "opening a file (`with open(fifo) as handle:`)", main


# Jobs whose main thread only supervises while a worker thread works (tests/targets/supervisor.py).
HANG = ("hang", "--duration", "4", "--samples", "5")


def _supervisor(main: str, worker: str, *more: str) -> Target:
    return Target("supervisor.py", via="plain", args=["--main", main, "--worker", worker, *more])


def _worker_blocked(job: Target, calls: Tuple[str, ...]) -> bool:
    """Whether the worker thread (its native id on the ready line) is inside one of the system
    calls `calls` ("202 " futex, "230 " clock_nanosleep...), as the kernel shows it."""
    native_id = job.ready_line().split()[1]
    return Path(f"/proc/{job.pid}/task/{native_id}/syscall").read_text().startswith(calls)


@pytest.mark.parametrize("main", ["sleep", "poll"])
def test_a_main_thread_that_supervises_a_computing_worker_is_not_hung(main: str) -> None:
    """`while worker.is_alive(): time.sleep(1)`, or a 0.1 s `Event.wait` poll, in the main thread,
    the work in a worker thread: the main thread only loops on a wait, so the worker carries the
    job with it (it was 'hung: no thread that carries the process moved ('MainThread')', exit 11)."""
    with _supervisor(main, "compute") as job:
        result = probing(str(job.pid), *HANG)
        assert result.returncode == ExitCode.OK, result.stdout + result.stderr
        verdict = result.stdout.splitlines()[0]
        assert verdict.startswith(f"PID {job.pid} is progressing: thread 'worker' "), verdict
        assert "; the main thread only loops on a wait (" in verdict
        assert "): the threads it supervises carry the process" in verdict


@pytest.mark.parametrize(
    "main, worker, calls",
    [("sleep", "stuck", ("202 ",)), ("poll", "stuck-in-c", ("230 ", "35 "))],
    ids=["sleep-lock", "poll-in-c"],
)
def test_a_supervisor_whose_worker_is_stuck_is_hung_and_the_worker_named(
    main: str, worker: str, calls: Tuple[str, ...]
) -> None:
    with _supervisor(main, worker) as job:
        assert wait_until(lambda: _worker_blocked(job, calls), timeout=10)
        result = probing(str(job.pid), *HANG, "--format", "json")
        assert result.returncode == ExitCode.HUNG, result.stdout + result.stderr
        report = json.loads(result.stdout)
        reason = report["reason"]
        assert reason.startswith("no thread that carries the process moved ('MainThread', 'worker'); "), (
            reason
        )
        assert "the main thread only loops on a wait" in reason
        by_name = {thread["name"]: thread for thread in report["threads"]}
        assert by_name["MainThread"]["activity"] == "looping" and by_name["worker"]["activity"] == "still"
        assert by_name["MainThread"]["carries"] and by_name["worker"]["carries"]


def test_thread_names_a_worker_that_carries_a_job_whose_main_thread_waits_for_good() -> None:
    """A main thread that waits once, without a timeout (`done.wait()`), cannot be told from a
    stuck one: the verdict is hung, and says which thread progressed and how to name it."""
    with _supervisor("wait", "compute") as job:
        default = probing(str(job.pid), *HANG)
        assert default.returncode == ExitCode.HUNG, default.stdout + default.stderr
        assert (
            "moved ('MainThread'); 'worker' progressed: if it carries the job, say so with --thread worker"
            in (default.stdout)
        )
        named = probing(str(job.pid), *HANG, "--thread", "worker")
        assert named.returncode == ExitCode.OK, named.stdout + named.stderr
        verdict = named.stdout.splitlines()[0]
        assert verdict.startswith(f"PID {job.pid} is progressing: thread 'worker' ")
        assert "; the threads named by --thread worker carry the process" in verdict


def test_thread_makes_a_stuck_worker_decide_while_another_computes() -> None:
    with _supervisor("sleep", "stuck", "--loader") as job:
        assert wait_until(lambda: _worker_blocked(job, ("202 ",)), timeout=10)
        default = probing(str(job.pid), *HANG)
        assert default.returncode == ExitCode.OK, default.stdout + default.stderr
        assert "is progressing: thread 'loader' " in default.stdout
        named = probing(str(job.pid), *HANG, "--thread", "work*", "--format", "json")
        assert named.returncode == ExitCode.HUNG, named.stdout + named.stderr
        report = json.loads(named.stdout)
        assert report["reason"].startswith(
            "no thread that carries the process moved ('worker'); the threads named by --thread 'work*' carry"
        )
        assert "'loader' progressed" in report["reason"]
        assert [thread["name"] for thread in report["threads"] if thread["carries"]] == ["worker"]


def test_a_thread_name_that_matches_no_thread_is_an_error_naming_those_there_are() -> None:
    with _supervisor("sleep", "compute") as job:
        started = time.monotonic()
        result = probing(str(job.pid), "hang", "--duration", "30", "--thread", "worker", "--thread", "wrker")
        assert result.returncode == ExitCode.USAGE, result.stdout + result.stderr
        assert f"--thread 'wrker': no such thread in PID {job.pid}; its threads: 'MainThread', 'worker'" in (
            result.stderr
        )
        assert time.monotonic() - started < 20  # said at the first sample, not after the window


def test_thread_on_every_rank_of_a_job() -> None:
    """`hang --ranks all --thread NAME`: each rank judged by its named threads; a name that no
    rank has is each rank's error, and the exit is that error's (2) when no rank could be watched."""
    with TorchrunJob("healthy", ranks=2) as job:
        hang = ("hang", "--ranks", "all", "--duration", "2", "--samples", "4", "--format", "json")
        result = probing(str(job.agent_pid), *hang, "--thread", "MainThread", timeout=120)
        assert result.returncode == ExitCode.OK, result.stdout + result.stderr
        ranks = json.loads(result.stdout)["ranks"]
        assert len(ranks) == 2 and all("named by --thread MainThread" in rank["reason"] for rank in ranks)
        wrong = probing(str(job.agent_pid), *hang, "--thread", "nope", timeout=120)
        assert wrong.returncode == ExitCode.USAGE, wrong.stdout + wrong.stderr
        missing = json.loads(wrong.stdout)["missing"]
        assert len(missing) == 2 and all(
            "--thread 'nope': no such thread" in rank["reason"] for rank in missing
        )


@pytest.fixture(scope="module")
def stuck_loader() -> Iterator[Target]:
    """One DataLoader whose worker is stuck at index 5, for the tests that only look at it: they
    come last, as it lives until the file ends."""
    pytest.importorskip("torch")
    with Target("dataloader_stuck.py", via="plain") as job:
        yield job


def test_hang_points_at_the_dataloader_worker_holding_the_batch(stuck_loader: Target) -> None:
    import psutil

    job = stuck_loader
    assert wait_until(lambda: len(psutil.Process(job.pid).children()) >= 2, timeout=30)
    # On a busy machine the main thread may still be taking batches 0-4 when the first
    # watch starts: it is then rightly "progressing". It blocks for good at batch 5.
    for _ in range(5):
        result = probing(str(job.pid), "hang", "--duration", "1.5", "--samples", "3")
        if result.returncode != ExitCode.OK:
            break
    assert result.returncode == ExitCode.HUNG, result.stderr
    assert "MainThread (main)" in result.stdout and "waiting for a DataLoader worker" in result.stdout
    assert "The DataLoader is waiting for worker PID " in result.stdout
    assert "stuck in __getitem__ (dataloader_stuck.py:" in result.stdout and "index 5" in result.stdout
    assert "in __getitem__\n    threading.Event().wait()" in result.stdout
    # The worker's header names its Python; locals only where they say something (the
    # innermost frames, __getitem__'s index), not the DataLoader machinery's.
    assert "(Python 3." in result.stdout and "(Python None)" not in result.stdout
    assert "      index = 5" in result.stdout and "possibly_batched_index =" not in result.stdout


def test_an_idle_dataloader_worker_waits_for_work(stuck_loader: Target) -> None:
    import psutil

    job = stuck_loader
    assert wait_until(lambda: len(psutil.Process(job.pid).children()) >= 2, timeout=30)
    expected = "main thread: DataLoader worker waiting for work (an index from its queue)"

    def one_worker_idle() -> bool:
        texts = [probing(str(child.pid), "backtrace").stdout for child in psutil.Process(job.pid).children()]
        return any(expected in text for text in texts) and any("__getitem__" in text for text in texts)

    # The idle worker finishes the indices it was given first: bounded, it ends up waiting.
    assert wait_until(one_worker_idle, timeout=30, interval=0.5)
