"""`backtrace --ranks all` on a job of 64 real agents over 4 simulated nodes (issue 28's harness,
benchmarks/scale/: each node its own PID, mount and UTS namespace, its ranks forked from one
process that imported torch, listening with the token on 127.0.0.(N+2), registered in the job's
TCPStore). Run in node 0, the CLI reaches 16 ranks over Unix sockets and 48 over TCP, and every
rank must be in the folds: a rank missing from the answer fails these tests."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

SCALE = Path(__file__).resolve().parents[2] / "benchmarks" / "scale"
sys.path.insert(0, str(SCALE))

from scale_job import ScaleJob  # noqa: E402

from support import SIMULATED_NODES  # noqa: E402

pytestmark = [
    *SIMULATED_NODES,
    pytest.mark.serial,  # 64 agents starting at once take both cores for seconds
    pytest.mark.timeout(240),
]

RANKS, NODES = 64, 4


@pytest.fixture(scope="module")
def job() -> Iterator[ScaleJob]:
    with ScaleJob(RANKS, NODES, ready_timeout=150) as started:
        yield started


def spans(text: str) -> List[int]:
    """The ranks of a fold's heading: 0-30,32-63 -> 0..30, 32..63."""
    ranks: List[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        ranks.extend(range(int(low), int(high or low) + 1))
    return ranks


def folds(stdout: str) -> List[Tuple[List[int], str, str]]:
    """(ranks, thread name, state) of every fold of `backtrace --ranks all`."""
    found, heading = [], None
    for line in stdout.splitlines():
        head = re.match(r"── ranks? (\S+) \(", line)
        if head:
            heading = spans(head.group(1))
        thread = re.match(r'Thread "([^"]+)"[^:]*: (.*) \(most recent call last\):$', line)
        if thread and heading is not None:
            found.append((heading, thread.group(1), thread.group(2)))
            heading = None
    return found


def backtrace(job: ScaleJob) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run(job.cli_command(0, "1", "backtrace", "--ranks", "all"), capture_output=True,
                          text=True, timeout=120, env=job.cli_environment())  # fmt: skip


def by_thread(found: List[Tuple[List[int], str, str]]) -> Dict[str, List[int]]:
    """Thread name -> every rank of its folds, each as often as it was shown."""
    ranks: Dict[str, List[int]] = {}
    for each, name, _ in found:
        ranks.setdefault(name, []).extend(each)
    return ranks


def test_every_rank_is_folded_once_per_thread_with_exact_rank_ranges(job: ScaleJob) -> None:
    result = backtrace(job)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"world size {RANKS}, {RANKS} ranks asked here" in result.stdout.splitlines()[0]
    found = folds(result.stdout)
    stuck = job.stuck_rank
    main = [(ranks, state) for ranks, name, state in found if name == "MainThread"]
    waiting = [rank for rank in range(RANKS) if rank != stuck]
    assert sorted(main) == sorted([(waiting, "in torch.distributed.all_reduce"), ([stuck], "sleeping")]), main
    heading = f"── ranks 0-{stuck - 1},{stuck + 1}-{RANKS - 1} ("
    assert heading in result.stdout, result.stdout[:2000]
    # The job's own threads: whatever the folds, each rank shows each thread exactly once.
    shown = by_thread(found)
    assert set(shown) == {"MainThread", "prefetch", "checkpoint-watchdog"}, sorted(shown)
    for name, ranks in shown.items():
        assert sorted(ranks) == list(range(RANKS)), (name, sorted(ranks))
    # The same stack is one block, whether its source lines could be read (this node's ranks) or
    # not (the other nodes').
    for name in ("prefetch", "checkpoint-watchdog"):
        assert [sorted(ranks) for ranks, thread, _ in found if thread == name] == [list(range(RANKS))], name


def test_a_killed_rank_is_missing_from_the_folds_and_named(job: ScaleJob) -> None:
    """Last (it kills a rank of the module's job): the folds above would no longer hold."""
    killed = 40  # on node 2: reached over TCP, its endpoint still in the store
    job.kill_ranks([killed])
    result = backtrace(job)
    assert result.returncode == 14, result.stdout[-2000:] + result.stderr[-2000:]
    main = {tuple(ranks) for ranks, name, _ in folds(result.stdout) if name == "MainThread"}
    alive: Set[int] = set(range(RANKS)) - {killed, job.stuck_rank}
    assert main == {tuple(sorted(alive)), (job.stuck_rank,)}, main
    assert re.search(rf"^probing: rank {killed} \(PID \d+ on node2\): ", result.stderr, re.M), result.stderr
