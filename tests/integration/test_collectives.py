"""python.collectives and python.process_groups against real torchrun jobs (gloo, CPU): read from
the job's own Flight Recorder, and recorded by probing where the job switched it off.

Each torchrun job costs seconds on a small machine: the jobs are module-scoped and shared.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List

import pytest

from support import Target, TorchrunJob, probing, wait_until

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.integration, pytest.mark.needs("torch", "torchrun")]

WAITING = "SELECT * FROM python.collectives WHERE state != 'completed'"
# The name of torch.distributed.all_reduce's code: probing's wrapper is called `recorded`.
# The name of the function torch.distributed.all_reduce and distributed_c10d.all_reduce are now:
# "recorded" while probing's wrapper sits there.
ALL_REDUCE_CODE = (
    "import torch.distributed as d, torch.distributed.distributed_c10d as c; "
    "print(d.all_reduce.__code__.co_name, c.all_reduce.__code__.co_name)"
)


def rows(pid: int, sql: str) -> List[Dict[str, Any]]:
    result = probing(str(pid), "query", "--format", "json", sql)
    assert result.returncode == 0, result.stderr
    found: List[Dict[str, Any]] = json.loads(result.stdout)
    return found


@pytest.fixture(scope="module")
def stalled_job() -> Iterator[TorchrunJob]:
    """3 ranks; rank 1 stalls before the all_reduce of step 5 (seq 6): ranks 0 and 2 wait in it."""
    with TorchrunJob("stall", ranks=3, args=["--rank-at", "1"]) as job:
        yield job


@pytest.fixture(scope="module")
def stalled_job_without_flight_recorder() -> Iterator[TorchrunJob]:
    with TorchrunJob("stall", ranks=2, args=["--rank-at", "1"], env={"TORCH_FR_BUFFER_SIZE": "0"}) as job:
        yield job


def test_a_waiting_rank_shows_the_all_reduce_it_waits_in_from_the_flight_recorder(
    stalled_job: TorchrunJob,
) -> None:
    waiting = rows(stalled_job.pids[0], WAITING)
    assert len(waiting) == 1, waiting
    row = waiting[0]
    assert (row["rank"], row["pg_id"], row["pg_desc"], row["pg_ranks"]) == (
        0,
        "0",
        "default_pg",
        "[0, 1, 2]",
    )
    assert (row["seq"], row["op"], row["backend"], row["profiling_name"]) == (
        6,
        "all_reduce",
        "gloo",
        "gloo:all_reduce",
    )
    assert (row["input_sizes"], row["input_dtypes"]) == ([[16]], ["Float"])
    assert row["state"] == "scheduled" and row["source"] == "flight_recorder"
    assert row["waited"] > 0 and row["time_completed"] is None and row["timeout_s"] == 1800.0
    # The stalled rank has enqueued nothing it has not finished.
    assert rows(stalled_job.pids[1], WAITING) == []
    done = rows(
        stalled_job.pids[1], "SELECT max(seq) AS seq FROM python.collectives WHERE state = 'completed'"
    )
    assert done == [{"seq": 5}]


def test_process_groups_show_the_waiting_ranks_ahead_of_the_stalled_one(stalled_job: TorchrunJob) -> None:
    sql = (
        "SELECT rank, pg_id, size, backend, last_enqueued, last_completed, source FROM python.process_groups"
    )
    waiting = rows(stalled_job.pids[2], sql)
    assert waiting == [
        {"rank": 2, "pg_id": "0", "size": 3, "backend": "gloo", "last_enqueued": 6, "last_completed": 5,
         "source": "flight_recorder"}
    ]  # fmt: skip
    behind = rows(stalled_job.pids[1], sql)
    assert (behind[0]["last_enqueued"], behind[0]["last_completed"]) == (5, 5)


def test_without_a_flight_recorder_probing_finds_the_waiting_call_and_records_its_own(
    stalled_job_without_flight_recorder: TorchrunJob,
) -> None:
    job = stalled_job_without_flight_recorder
    result = probing(str(job.pids[0]), "query", "--format", "json", WAITING)
    assert result.returncode == 0, result.stderr
    assert "no Flight Recorder on" in result.stderr
    waiting = json.loads(result.stdout)
    assert len(waiting) == 1, waiting
    row = waiting[0]
    # Begun before probing looked: found on the thread's stack, its sequence number the group's.
    assert (row["seq"], row["op"], row["pg_ranks"], row["state"], row["source"]) == (
        6, "all_reduce", "[0, 1]", "started", "probing",
    )  # fmt: skip
    assert row["input_sizes"] == [[16]] and row["input_dtypes"] == ["Float"]
    groups = "SELECT last_enqueued, source FROM python.process_groups"
    assert rows(job.pids[0], groups) == [{"last_enqueued": 6, "source": "probing"}]
    assert rows(job.pids[1], groups) == [{"last_enqueued": 5, "source": "probing"}]


def test_without_a_flight_recorder_the_calls_are_recorded_with_matching_sequence_numbers_and_detach_unwraps(
) -> None:  # fmt: skip
    with TorchrunJob("healthy", ranks=2, env={"TORCH_FR_BUFFER_SIZE": "0"}) as job:
        sql = "SELECT seq, op, state, input_sizes, waited FROM python.collectives WHERE state = 'completed'"
        assert rows(job.pids[0], sql) == []  # the first query starts the recording
        assert wait_until(lambda: len(rows(job.pids[0], sql)) >= 3, 30, 0.2)
        assert wait_until(lambda: len(rows(job.pids[1], sql)) >= 3, 30, 0.2)
        by_rank = [{row["seq"]: row for row in rows(pid, sql)} for pid in (job.pids[0], job.pids[1])]
        shared = sorted(set(by_rank[0]) & set(by_rank[1]))
        assert shared, by_rank
        for seq in shared:
            assert by_rank[0][seq]["op"] == by_rank[1][seq]["op"] == "all_reduce"
            assert by_rank[0][seq]["waited"] >= 0
        wrapped = probing(str(job.pids[0]), "eval", ALL_REDUCE_CODE)
        assert (wrapped.returncode, wrapped.stdout) == (0, "recorded recorded\n"), wrapped.stderr
        assert probing(str(job.pids[0]), "detach").returncode == 0
        # eval attaches a fresh agent, which wraps nothing until these tables are asked for.
        restored = probing(str(job.pids[0]), "eval", ALL_REDUCE_CODE)
        assert (restored.returncode, restored.stdout) == (0, "wrapper wrapper\n"), restored.stderr


def test_a_torch_job_that_is_not_distributed_has_empty_tables_and_says_why() -> None:
    with Target("torch_job.py", via="plain") as job:
        for table in ("python.collectives", "python.process_groups"):
            result = probing(str(job.pid), "query", "--format", "json", f"SELECT * FROM {table}")
            assert result.returncode == 0, result.stderr
            assert json.loads(result.stdout) == []
            assert f"{table} is empty: this process has not initialised torch.distributed" in result.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (NCCL)")
def test_nccl_collectives_come_from_the_flight_recorder_on_a_gpu() -> None:
    """One rank on one GPU (NCCL refuses two ranks on one device): the NCCL process group's
    Flight Recorder is read like gloo's. Its ring is sized here, not left to each torch's
    default. On an H200 with torch 2.11 this test once read our own record (`source`
    'probing'): the agent read the first recorder that answered, gloo's, empty, and NCCL's is
    another (tests/unit/test_flight_recorder_dumps.py)."""
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    with TorchrunJob("healthy", ranks=1, args=["--backend", "nccl"], env=env) as job:
        sql = "SELECT op, backend, state, source FROM python.collectives ORDER BY seq DESC LIMIT 3"
        found = []

        def recorded() -> bool:
            found[:] = rows(job.pids[0], sql)
            return any(row["state"] == "completed" for row in found)

        assert wait_until(recorded, 30, 0.5), found
        assert {(row["op"], row["backend"], row["source"]) for row in found} == {
            ("all_reduce", "nccl", "flight_recorder")
        }
        stacks = probing(str(job.pids[0]), "backtrace", "--ranks", "all")
        assert stacks.returncode == 0 and "train" in stacks.stdout, stacks.stderr
