"""`stragglers` on real torchrun jobs (gloo, CPU, DDP) whose ranks are made slow: the rank the
job waits for is named, with its delay and the phase its extra time goes to (3 ranks for a slow
data loading, 4 for a slow forward); two are named in order (4 ranks: two slow among two on time);
python.collective_timings says the same in SQL."""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List

from support import TARGETS, TorchrunJob, probing

DURATION = 4.0
STRAGGLERS = ("stragglers", "--ranks", "all", "--duration", str(DURATION), "--format", "json")


def _job(*args: str, ranks: int = 3) -> TorchrunJob:
    return TorchrunJob(script="straggler_job.py", ranks=ranks, args=list(args))


def _attached(job: TorchrunJob) -> None:
    """Every rank's agent in place, so that what is timed is the watching alone."""
    result = probing(str(job.pids[0]), "backtrace", "--ranks", "all", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def _verdict(job: TorchrunJob, expected_exit: int) -> Dict[str, Any]:
    result = probing(str(job.pids[0]), *STRAGGLERS, timeout=120)
    assert result.returncode == expected_exit, result.stdout + result.stderr
    verdict: Dict[str, Any] = json.loads(result.stdout)
    verdict["stderr"] = result.stderr  # its notes (a rank whose stacks were not sampled), for a failure
    return verdict


def _line(text: str) -> int:
    source = (TARGETS / "straggler_job.py").read_text().splitlines()
    return next(number for number, line in enumerate(source, 1) if line.strip() == text)


def _named(verdict: Dict[str, Any]) -> List[int]:
    return [each["rank"] for each in verdict["stragglers"]]


def test_a_rank_slow_in_its_data_loading_is_named_with_its_delay_and_phase() -> None:
    with _job("--slow-data", "1:20") as job:
        _attached(job)
        started = time.monotonic()
        verdict = _verdict(job, 20)
        took = time.monotonic() - started
        text = probing(str(job.pids[2]), "stragglers", "--duration", "2", timeout=120)
        rows = probing(
            str(job.pids[0]), "query", "--ranks", "all", "--format", "json",
            "SELECT rank, avg(last::INTEGER) AS last_share, median(wait_s) AS wait_s "
            "FROM python.collective_timings WHERE ranks_arrived = group_size GROUP BY rank ORDER BY rank",
        )  # fmt: skip
    assert _named(verdict) == [1], verdict
    [straggler] = verdict["stragglers"]
    assert 0.014 <= straggler["delay_s"] <= 0.026, straggler  # 20 ms, within 30%
    assert straggler["phase"] == "data loading" and straggler["late_share"] >= 0.9, verdict
    assert (
        straggler["frame"]
        == f"ShardReader.read (straggler_job.py:{_line('time.sleep(SLOW_DATA[self.rank])  # a slow disk')})"
    )
    assert verdict["compared"] >= 20 and verdict["step_s"] > 0.02
    assert took <= DURATION + 6, took  # the goal is DURATION + 3 s; the rest is this box's load
    # Without --ranks, the job TARGET belongs to; its verdict first, for people.
    assert text.returncode == 20, text.stdout + text.stderr
    assert text.stdout.splitlines()[1].startswith("Straggler: rank 1 is late to ")
    assert "it spends the extra time in data loading (`ShardReader.read`, straggler_job.py:" in text.stdout
    assert rows.returncode == 0, rows.stderr
    by_rank = {row["rank"]: row for row in json.loads(rows.stdout)}
    assert by_rank[1]["last_share"] > 0.8 and by_rank[0]["last_share"] < 0.2
    assert by_rank[0]["wait_s"] > 0.01 > by_rank[1]["wait_s"]


def test_a_rank_slow_in_its_forward_is_named_with_its_phase() -> None:
    with _job("--slow-forward", "2:25", ranks=4) as job:  # with 3, one CI run found no phase (why, unkept)
        _attached(job)
        verdict = _verdict(job, 20)
    assert _named(verdict) == [2], verdict
    [straggler] = verdict["stragglers"]
    assert straggler["phase"] == "forward", verdict
    assert straggler["frame"].startswith("Net.forward (straggler_job.py:"), straggler


def test_two_stragglers_of_different_size_are_named_in_order() -> None:
    with _job("--slow-data", "1:15", "--slow-forward", "3:40", ranks=4) as job:
        _attached(job)
        verdict = _verdict(job, 20)
    assert _named(verdict) == [3, 1], verdict
    assert [each["phase"] for each in verdict["stragglers"]] == ["forward", "data loading"], verdict
    first, second = verdict["stragglers"]
    assert first["delay_s"] > second["delay_s"] > 0.009
