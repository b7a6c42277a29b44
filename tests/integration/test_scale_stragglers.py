"""`stragglers --ranks all` on 64 ranks over 4 simulated nodes (issue 28's harness, its straggler
scenario: every rank all_reduces once a second on one schedule, in a gloo world of its own, so
its real Flight Recorder holds its arrivals; rank 37 reads its shard 200 ms first). Run on node 0,
the CLI reaches 16 ranks over Unix sockets and 48 through their nodes' relays; the straggler must
be named, with the frame it spends its extra time in, within the window plus 5 s."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCALE = Path(__file__).resolve().parents[2] / "benchmarks" / "scale"
sys.path.insert(0, str(SCALE))

from scale_job import ScaleJob  # noqa: E402

from support import SIMULATED_NODES  # noqa: E402

pytestmark = [
    *SIMULATED_NODES,
    pytest.mark.serial,  # 64 ranks stepping and sampled at once take both cores
    pytest.mark.timeout(300),
]

WINDOW_S = 10.0


def test_one_straggler_among_64_ranks_on_4_nodes_is_named() -> None:
    with ScaleJob(64, 4, ready_timeout=200, straggler=37, step_s=1.0) as job:
        time.sleep(2)  # a few steps on every rank
        started = time.monotonic()
        command = ["stragglers", "--ranks", "all", "--duration", str(WINDOW_S), "--format", "json"]
        result = subprocess.run(job.cli_command(0, "1", *command), capture_output=True, text=True,
                                timeout=200, env=job.cli_environment())  # fmt: skip
        took = time.monotonic() - started
    assert result.returncode == 20, result.stdout[-2000:] + result.stderr[-2000:]
    verdict = json.loads(result.stdout)
    assert [each["rank"] for each in verdict["stragglers"]] == [37], verdict["summary"]
    [straggler] = verdict["stragglers"]
    assert 0.16 <= straggler["delay_s"] <= 0.3 and straggler["frame"].startswith("read_shard (rank.py:")
    assert len(verdict["ranks"]) == 64 and verdict["missing"] == []
    assert took <= WINDOW_S + 5 + 5, took  # the goal is the window + 5 s; the rest is this box's load
