"""`stragglers` where there is none to name: a healthy job (exit 0), a job stuck rather than
slow (exit 11, pointing to `hang`), and targets that are no job."""

from __future__ import annotations

import json

from support import TARGETS, Target, TorchrunJob, probing


def test_a_job_of_equal_ranks_has_no_straggler() -> None:
    with TorchrunJob(script="straggler_job.py", ranks=3, args=[]) as job:
        result = probing(str(job.pids[0]), "stragglers", "--duration", "4", "--format", "json", timeout=120)
        text = probing(str(job.pids[0]), "stragglers", "--duration", "2", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["verdict"] == "no straggler" and verdict["stragglers"] == [], verdict
    assert len(verdict["ranks"]) == 3 and verdict["compared"] >= 20
    assert text.returncode == 0, text.stdout + text.stderr
    assert "no straggler: no rank is late to 75% of the all_reduces by " in text.stdout
    assert "; the latest, rank " in text.stdout


def test_a_stuck_rank_is_said_to_be_hung_and_points_to_hang() -> None:
    with TorchrunJob(script="straggler_job.py", ranks=3, args=["--stuck", "1", "--step", "5"]) as job:
        result = probing(str(job.pids[0]), "stragglers", "--duration", "3", timeout=120)
    assert result.returncode == 11, result.stdout + result.stderr
    assert "the job is stuck, not slow: ranks 0, 2 waited" in result.stdout
    source = (TARGETS / "straggler_job.py").read_text().splitlines()
    line = next(number for number, text in enumerate(source, 1) if "time.sleep(3600)" in text)
    assert f"rank 1 never arrived (rank 1 in `ShardReader.read`, straggler_job.py:{line})" in result.stdout
    assert "`hang --ranks all` says where" in result.stdout


def test_a_process_of_no_job_is_told_so() -> None:
    with Target("sleeper.py") as target:
        result = probing(str(target.pid), "stragglers", "--duration", "1")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.startswith("probing: error: "), result.stderr
