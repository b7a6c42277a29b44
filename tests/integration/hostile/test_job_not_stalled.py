"""Looking must not hold the job still: a command's work in the agent lets the job's threads run
every few milliseconds, and what it cannot cut (one C call) is estimated first and left out, with
a note, when it would take too long (DESIGN.md, "Agent rules").

Each job here is expensive to look at and has a heartbeat thread that wakes every millisecond
(tests/targets/heavy_heartbeat.py); the longest gap between its wake-ups while a command runs is
how long the job was held still. Before the fix, `memory` on a job of millions of objects held it
for the listing of gc's oldest generation (130-510 ms for eight million here), and
python.collectives for the decoding of torch's Flight Recorder dump of a full ring on top of the
dump itself. And reading the stacks could freeze a job for good on CPython up to 3.11.
"""

from __future__ import annotations

import json
import subprocess
from typing import List, Tuple

import pytest

from support import TARGETS, VENV_PYTHON, Target, probing, wait_until

# The longest gap of a 1 ms heartbeat, bounded at 80 ms: with the parallel part's workers on the
# two cores a gap that long is the scheduler's, not probing's. It runs alone.
pytestmark = pytest.mark.serial

MAX_ROWS = 10000  # python.collectives keeps the newest this many (agent/pytorch/collectives.py)
# What the heartbeat may be held still on a loaded 2-core machine shared with other tests: its
# own scheduling, gc's collections in the job, the CLI starting (3-50 ms measured). Each fixed
# cause above held it twice this long at least, every time; the machine's own stalls (a load of
# 10 on 2 cores starves a thread for 100-400 ms now and then) come and go, so the best of TRIES
# runs is what is judged.
HELD_STILL_BOUND_S = 0.08
TRIES = 3


def held_still(job: Target) -> float:
    """The heartbeat's longest gap since the last question, in seconds."""
    assert job.process.stdin is not None
    before = len(job.stdout_lines)
    job.process.stdin.write(b"\n")
    job.process.stdin.flush()
    assert wait_until(lambda: any(line.startswith("stall ") for line in job.stdout_lines[before:]), 30), (
        job.output()
    )
    answer: List[str] = next(line for line in job.stdout_lines[before:] if line.startswith("stall ")).split()
    return float(answer[1])


def while_held(job: Target, *command: str, tries: int = TRIES) -> Tuple[float, str, str]:
    """(the shortest the job was held still in `tries` runs of `command`, its stdout, its stderr)."""
    stalls = []
    for _ in range(tries):
        held_still(job)
        result = probing(str(job.pid), *command, timeout=180)
        stalls.append(held_still(job))
        assert result.returncode == 0, result.stderr
    return min(stalls), result.stdout, result.stderr


def test_memory_of_a_job_of_millions_of_objects_leaves_its_oldest_generation_out_rather_than_stall() -> None:
    with Target("heavy_heartbeat.py", via="env", args=["--objects", "8000000"], ready_timeout=240) as job:
        stall, out, _ = while_held(job, "memory", "--format", "json")
        summary = json.loads(out)
        assert stall < HELD_STILL_BOUND_S, f"held still {stall * 1e3:.0f} ms"
        # Left out, and said: never a count silently short.
        assert summary["gc"]["cut_short"], summary["gc"]
        notes = " ".join(summary["notes"])
        assert "gc's generation 2 (about" in notes and "was not listed" in notes, notes
        assert "--scan-budget S allows S/100" in notes
        # The same for the tables: a NULL with its reason, never a count silently short.
        sql = "SELECT generation, objects FROM python.gc_generations ORDER BY generation"
        generations = probing(str(job.pid), "query", sql, "--format", "json")
        assert generations.returncode == 0, generations.stderr
        assert json.loads(generations.stdout)[2] == {"generation": 2, "objects": None}
        assert "python.gc_generations: objects left NULL: gc's generation 2" in generations.stderr
        # With a budget that accepts the cost, the user gets the whole count.
        whole = probing(str(job.pid), "memory", "--format", "json", "--scan-budget", "100", timeout=240)
        assert whole.returncode == 0, whole.stderr
        counted = json.loads(whole.stdout)["gc"]
        assert not counted["cut_short"] and counted["objects"] >= 8_000_000
        assert job.alive()


TIME_THE_DUMP = (
    "import time\n"
    "from torch._C._distributed_c10d import _dump_fr_trace\n"
    "started = time.perf_counter()\n"
    "_dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)\n"
    "time.perf_counter() - started"
)


@pytest.mark.parametrize("entries", [20000])
def test_python_collectives_add_nothing_that_holds_the_job_to_torchs_own_dump(entries: int) -> None:
    """torch's binding makes the dump holding the GIL (not ours to slice: docs/decisions.md);
    everything the agent does with it after is paced. Before, decoding the pickle whole and
    building the rows added 0.3-0.7 s to a 20 000-entry ring's dump, gc's oldest collection
    among them."""
    pytest.importorskip("torch")
    env = {"TORCH_FR_BUFFER_SIZE": str(entries), "OMP_NUM_THREADS": "1"}
    with Target(
        "heavy_heartbeat.py", via="env", args=["--collectives", str(entries)], env=env, ready_timeout=240
    ) as job:
        sql = "SELECT count(*) AS n, max(seq) AS last FROM python.collectives"
        # Each query against a dump timed just before it: torch's dump alone moved from 305 to
        # 405 ms over three tries in one CI run, more than the bound.
        tries = []
        for _ in range(TRIES):
            timed = probing(str(job.pid), "eval", TIME_THE_DUMP, "--timeout", "60", timeout=120)
            assert timed.returncode == 0, timed.stderr
            stall, out, err = while_held(job, "query", sql, "--format", "json", tries=1)
            tries.append((stall - float(timed.stdout), stall, float(timed.stdout)))
        extra, stall, dump = min(tries)
        assert extra < HELD_STILL_BOUND_S, (
            f"held still {stall * 1e3:.0f} ms; torch's dump alone {dump * 1e3:.0f} ms (tries: {tries})"
        )
        # The whole ring was read: the table keeps the newest MAX_ROWS, and says so.
        assert json.loads(out) == [{"n": min(entries, MAX_ROWS), "last": entries}], out
        assert f"the newest {MAX_ROWS} of {entries} collectives are listed" in err
        assert job.alive()


def test_the_heartbeat_sees_a_job_held_still() -> None:
    """The instrument works: a C call that holds the GIL (a sleep in libc through PyDLL) shows."""
    with Target("heavy_heartbeat.py", via="env") as job:
        held_still(job)
        done = probing(str(job.pid), "eval", "import ctypes; ctypes.PyDLL(None).usleep(300000)")
        assert done.returncode == 0, done.stderr
        assert held_still(job) >= 0.25


def test_reading_the_stacks_never_deadlocks_a_job_whose_collections_let_the_gil_go() -> None:
    """sys._current_frames() deadlocks CPython up to 3.11 (gh-106883) when a collection started
    inside it runs Python code that lets the GIL go and another thread then ends: four clients
    running `backtrace` in a loop froze a training job for good within a minute (the agent's own
    threads end after each connection). The agent pauses gc around it on those versions; this
    job sets the trap on every read (tests/targets/frames_trap.py)."""
    try:
        done = subprocess.run(
            [VENV_PYTHON, str(TARGETS / "frames_trap.py"), "5"], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("reading the stacks deadlocked the process (it was killed after 60 s)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("alive "), done.stdout
