"""`probing PID flamegraph --ranks`: every rank of a real torchrun job (gloo, CPU) sampled over
the same window, or its module times read, each rank under a root frame `rank N`; a rank that
cannot answer is named and the others are drawn (exit 14)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Dict, List

import pytest

from probing.errors import ExitCode

from support import TorchrunJob, probing, wait_until

pytest.importorskip("torch")


def folded_by_rank(path: Path) -> Dict[str, List[str]]:
    """rank frame -> the stacks under it (`frame;frame weight` lines without the rank)."""
    stacks: Dict[str, List[str]] = {}
    for line in path.read_text().splitlines():
        root, _, rest = line.partition(";")
        stacks.setdefault(root, []).append(rest)
    return stacks


def test_the_stalled_rank_is_a_tower_of_its_own_next_to_the_ranks_that_wait(tmp_path: Path) -> None:
    with TorchrunJob("stall", ranks=2, args=["--rank-at", "1", "--step", "2"]) as job:
        folded = tmp_path / "job.folded"
        result = probing(
            str(job.agent_pid), "flamegraph", "--ranks", "all", "--duration", "2", "-o", str(folded)
        )
        assert result.returncode == 0, result.stderr
        assert "2 ranks sampled for" in result.stderr and "by their agents" in result.stderr, result.stderr
        stacks = folded_by_rank(folded)
        assert set(stacks) == {"rank 0", "rank 1"}
        assert any("load_shard (ranks_job.py" in stack for stack in stacks["rank 1"]), stacks["rank 1"]
        assert not any("load_shard" in stack for stack in stacks["rank 0"]), stacks["rank 0"]
        assert any("all_reduce" in stack for stack in stacks["rank 0"]), stacks["rank 0"]

        page = tmp_path / "job.html"
        one = probing(str(job.agent_pid), "flamegraph", "--ranks", "1", "--duration", "1", "-o", str(page))
        assert one.returncode == 0, one.stderr
        assert "rank 1" in page.read_text() and "1 rank sampled" in one.stderr, one.stderr


def test_module_times_of_every_rank_and_a_rank_that_cannot_answer(tmp_path: Path) -> None:
    with TorchrunJob("healthy", ranks=2) as job:
        on = probing(str(job.agent_pid), "trace", "on", "--every", "1", "--ranks", "all")
        assert on.returncode == 0, on.stderr

        def traced(pid: int) -> bool:
            count = probing(
                str(pid), "query", "--format", "csv", "SELECT count(DISTINCT step) FROM python.torch_trace"
            )
            return count.returncode == 0 and int(count.stdout.split()[-1]) >= 3

        assert wait_until(lambda: all(traced(pid) for pid in job.pids.values()), 120, 0.2)
        folded = tmp_path / "modules.folded"
        result = probing(str(job.agent_pid), "flamegraph", "--torch", "--ranks", "all", "-o", str(folded))
        assert result.returncode == 0, result.stderr
        assert "per step and rank" in result.stderr and "2 ranks, " in result.stderr, result.stderr
        stacks = folded_by_rank(folded)
        assert set(stacks) == {"rank 0", "rank 1"}
        for rank in ("rank 0", "rank 1"):
            assert any(stack.startswith("forward;") for stack in stacks[rank]), stacks[rank]

        # A rank that cannot answer (frozen): the others drawn, that rank named, exit 14.
        os.kill(job.pids[1], signal.SIGSTOP)
        try:
            partial = tmp_path / "partial.folded"
            missing = probing(str(job.agent_pid), "flamegraph", "--torch", "--ranks", "all", "--timeout", "3",
                              "-o", str(partial))  # fmt: skip
        finally:
            os.kill(job.pids[1], signal.SIGCONT)
        assert missing.returncode == ExitCode.PARTIAL, missing.stderr
        assert f"rank 1 (PID {job.pids[1]})" in missing.stderr and "probing: wrote" in missing.stderr
        assert set(folded_by_rank(partial)) == {"rank 0"}


def test_a_record_has_no_ranks_to_sample(tmp_path: Path) -> None:
    record = tmp_path / "job.probing"  # a record by its name: refused before it is read
    record.write_bytes(b"")
    result = probing(str(record), "flamegraph", "--ranks", "all", "-o", str(tmp_path / "x.html"))
    assert result.returncode == ExitCode.NOT_LIVE, result.stderr
    assert "flamegraph --ranks needs a live process" in result.stderr
    assert not (tmp_path / "x.html").exists()
