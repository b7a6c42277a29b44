"""`hang --ranks all` and `run --hang-timeout -- torchrun ...` on real torchrun jobs (gloo, CPU):
one verdict for the job, the rank that is behind named with its place, the ranks waiting and in
what, and collectives that do not match across ranks. A job that goes wrong has 3 ranks and its
middle one, rank 1, goes wrong: the ranks waiting are not one run of numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from support import BIN, PROBING, TARGETS, TorchrunJob, probing

HANG = ("hang", "--ranks", "all", "--duration", "2", "--samples", "4", "--format", "json")
# 3 ranks, the middle one (rank 1) the one that goes wrong.
MIDDLE = ["--rank-at", "1"]


def _verdict(job: TorchrunJob, expected_exit: int) -> Dict[str, Any]:
    result = probing(str(job.agent_pid), *HANG, timeout=120)
    assert result.returncode == expected_exit, result.stdout + result.stderr
    verdict: Dict[str, Any] = json.loads(result.stdout)
    return verdict


def _line_of(text: str) -> int:
    source = (TARGETS / "ranks_job.py").read_text().splitlines()
    return next(number for number, line in enumerate(source, 1) if line.strip() == text)


def test_a_stalled_rank_is_named_with_the_collective_the_others_wait_in() -> None:
    with TorchrunJob("stall", ranks=3, args=MIDDLE) as job:
        verdict = _verdict(job, 11)
        text = probing(str(job.pids[0]), "hang", "--ranks", "all", "--duration", "1", "--samples", "3")
    assert verdict["hung"] and verdict["basis"] == "collectives"
    [behind] = verdict["behind"]
    assert behind["rank"] == 1 and behind["pid"] == job.pids[1]
    assert behind["where"] == f"load_shard (ranks_job.py:{_line_of('time.sleep(3600)')})"
    assert (behind["op"], behind["seq"], behind["last_seq"]) == ("all_reduce", 6, 5)
    [waiting] = verdict["waiting"]
    assert (waiting["ranks"], waiting["op"], waiting["seq"], str(waiting["pg_id"])) == (
        [0, 2],
        "all_reduce",
        6,
        "0",
    )
    assert verdict["mismatches"] == [] and verdict["missing"] == []
    assert text.returncode == 11
    assert text.stdout.startswith(
        "The job is hung: rank 1 has not reached all_reduce #6 of process group 0 (default_pg) that "
        "ranks 0, 2 wait in; it is in load_shard (ranks_job.py:"
    )


def test_a_rank_holding_the_gil_is_named_from_outside() -> None:
    with TorchrunJob("gil", ranks=3, args=MIDDLE) as job:
        verdict = _verdict(job, 11)
    [behind] = verdict["behind"]
    assert behind["rank"] == 1 and behind["holds_gil"] and behind["gil_holder"] == "MainThread"
    assert behind["where"].startswith("hold_the_gil (ranks_job.py:")
    assert [waiting["ranks"] for waiting in verdict["waiting"]] == [[0, 2]]


def test_a_mismatched_collective_is_reported_at_its_sequence_number() -> None:
    with TorchrunJob("mismatch", ranks=3, args=MIDDLE) as job:
        verdict = _verdict(job, 11)
    [mismatch] = verdict["mismatches"]
    assert (mismatch["seq"], mismatch["kind"], str(mismatch["pg_id"])) == (6, "op", "0")
    assert {call["op"]: call["ranks"] for call in mismatch["calls"]} == {
        "all_reduce": [0, 2],
        "broadcast": [1],
    }
    assert "does not match across ranks" in verdict["reason"]


def test_a_healthy_job_progresses() -> None:
    with TorchrunJob("healthy", ranks=2) as job:
        verdict = _verdict(job, 0)
    assert not verdict["hung"] and verdict["behind"] == [] and verdict["missing"] == []


@pytest.mark.needs("torch", "torchrun")
def test_the_run_watchdog_judges_the_whole_job(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    command = [
        PROBING, "run", "--hang-timeout", "4", "--report", str(report), "--",
        str(BIN / "torchrun"), "--standalone", "--nproc-per-node=3",
        str(TARGETS / "ranks_job.py"), "--scenario", "stall", "--rank-at", "1",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert result.returncode == 11, result.stderr[-3000:]
    assert "The job is hung: rank 1 has not reached all_reduce #6" in result.stderr
    document = json.loads(report.read_text())
    assert document["hung"] and document["job"]["behind"][0]["rank"] == 1
    assert document["job"]["waiting"][0]["ranks"] == [0, 2]
    assert len(document["processes"]) == 4  # torchrun and its 3 ranks, each with its stacks


def test_the_run_watchdog_watches_a_rank_that_started_late(tmp_path: Path) -> None:
    """The watchdog's first look comes while the launcher is still starting ranks (the last one
    2 s after the others, as on a loaded machine): the job is looked for again until every rank
    of this node is there, and the verdict judges all three."""
    report = tmp_path / "report.json"
    command = [
        PROBING, "run", "--hang-timeout", "4", "--report", str(report), "--",
        sys.executable, str(TARGETS / "staggered_launcher.py"), "--ranks", "3", "--late", "2",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 11, result.stderr[-3000:]
    assert "(3 ranks watched for" in result.stderr, result.stderr[-3000:]
    document = json.loads(report.read_text())
    assert sorted(rank["rank"] for rank in document["job"]["behind"]) == [0, 1, 2]
