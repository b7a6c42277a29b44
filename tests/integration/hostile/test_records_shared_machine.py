"""Records on a shared machine (issue 26): one user's jobs share a record directory, and a job
that writes many records (a cron of `probing PID record`, a job surviving its SIGHUPs) must not
push out another job's only record of its incident. Real agents write every record here; the
bounds are lowered by the same environment variables a user would set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from support import Target, probing


def write_record(pid: int, reason: str) -> Dict[str, Any]:
    result = probing(str(pid), "record", "--reason", reason, "--format", "json")
    assert result.returncode == 0, result.stderr
    answer: Dict[str, Any] = json.loads(result.stdout)
    return answer


def listed(directory: Path) -> List[Dict[str, Any]]:
    result = probing("records", "--dir", str(directory), "--format", "json")
    assert result.returncode == 0, result.stderr
    entries: List[Dict[str, Any]] = json.loads(result.stdout)
    return entries


def test_a_chatty_job_does_not_push_out_another_jobs_record(tmp_path: Path) -> None:
    directory = tmp_path / "records"
    env = {"PROBING_RECORD_DIR": str(directory), "PROBING_RECORD_KEEP": "3"}
    incident_job = Target("dies.py", via="env", env=env)
    with incident_job, Target("sleeper.py", via="env", env=env) as chatty:
        incident = write_record(incident_job.pid, "the incident")["path"]
        written = [write_record(chatty.pid, f"poll {number}")["path"] for number in range(5)]
        kept = sorted(str(path) for path in directory.glob("*.probing"))
        assert kept == sorted([incident, *written[2:]])  # the newest 3 of each job

        entries = listed(directory)
        pruned = [entry for entry in entries if entry["kind"] == "pruned"]
        assert sorted(entry["path"] for entry in pruned) == sorted(written[:2])
        assert all(entry["pid"] == chatty.pid for entry in pruned)
        assert "PROBING_RECORD_KEEP=3 keeps the newest 3 of each job" in pruned[0]["reason"]
        assert "job 'sleeper' had 4 records" in pruned[0]["reason"]
        text = probing("records", "--dir", str(directory)).stdout
        assert "removed to keep the directory within its bounds:" in text
        assert f"{written[1]} (" in text and f"{written[0]} (" in text

        # The directory's size bound, lowered in the live job (the agent reads its settings at
        # each record; the per-job bound raised out of the way): the next record puts the
        # directory over, and the job holding the most bytes gives its oldest; the incident stays.
        held = sum(path.stat().st_size for path in directory.glob("*.probing"))
        bound = f"{held / (1 << 20):.6f}"
        assignment = (
            f"import os; os.environ['PROBING_RECORD_TOTAL_MB'] = '{bound}'; "
            "os.environ['PROBING_RECORD_KEEP'] = '20'"
        )
        assert probing(str(chatty.pid), "eval", assignment).returncode == 0
        newest = write_record(chatty.pid, "over the size bound")["path"]
        assert Path(incident).exists() and Path(newest).exists() and not Path(written[2]).exists()
        by_size = [entry for entry in listed(directory) if entry["path"] == written[2]]
        assert len(by_size) == 1 and by_size[0]["kind"] == "pruned"
        over = f"over PROBING_RECORD_TOTAL_MB={float(bound):.3g}: the oldest of job 'sleeper'"
        assert over in by_size[0]["reason"]
        assert incident_job.finish() == 0 and chatty.finish() == 0
