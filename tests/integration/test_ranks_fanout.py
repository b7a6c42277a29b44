"""--ranks on real torchrun jobs (gloo, CPU, 3 or 4 ranks): every rank answers in one command, rows
carry their rank, identical stacks fold, and a rank that cannot answer is named while the
others' answers stand."""

from __future__ import annotations

import json
import os
import signal
from typing import Iterator

import pytest

from support import TorchrunJob, probing, wait_until


@pytest.fixture(scope="module")
def stalled() -> Iterator[TorchrunJob]:
    """Rank 2 sleeps in load_shard() before the all_reduce of step 5; ranks 0, 1, 3 wait in it
    (4 ranks: their fold, 0,1,3, has a run of two listed as such and a gap)."""
    with TorchrunJob("stall") as job:
        yield job


@pytest.fixture(scope="module")
def gil_held() -> Iterator[TorchrunJob]:
    """Rank 1 of 3 holds the GIL in a C call; its agent can never answer."""
    with TorchrunJob("gil", ranks=3, args=["--rank-at", "1"]) as job:
        yield job


def test_backtrace_folds_identical_stacks_by_rank(stalled: TorchrunJob) -> None:
    result = probing(str(stalled.agent_pid), "backtrace", "--ranks", "all")
    assert result.returncode == 0, result.stderr
    pids = stalled.pids
    assert f"── ranks 0,1,3 (PIDs {pids[0]}, {pids[1]}, {pids[3]}) ──" in result.stdout
    waiting, stuck = result.stdout.split(f"── rank 2 (PID {pids[2]}) ──")
    assert "main thread: in torch.distributed.all_reduce" in waiting and "load_shard" not in waiting
    assert "main thread: sleeping" in stuck and "in load_shard" in stuck
    assert f"torchrun PID {stalled.agent_pid}" in result.stdout.splitlines()[0]


def test_backtrace_rows_carry_rank_columns(stalled: TorchrunJob) -> None:
    result = probing(str(stalled.pids[1]), "backtrace", "--ranks", "1-2", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert {(row["rank"], row["local_rank"], row["node"], row["pid"]) for row in rows} == {
        (1, 1, 0, stalled.pids[1]),
        (2, 2, 0, stalled.pids[2]),
    }


@pytest.mark.parametrize("given", ["torchrun", "rank 3"])
def test_query_runs_over_every_rank(stalled: TorchrunJob, given: str) -> None:
    pid = stalled.agent_pid if given == "torchrun" else stalled.pids[3]
    sql = "SELECT rank, pid, func FROM python.backtrace WHERE depth = 0 AND is_main ORDER BY rank"
    result = probing(str(pid), "query", "--ranks", "all", "--format", "json", sql)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(row["rank"], row["pid"]) for row in rows] == sorted(stalled.pids.items())
    assert [row["func"] for row in rows] == ["all_reduce", "all_reduce", "load_shard", "all_reduce"]


def test_eval_runs_on_every_rank(stalled: TorchrunJob) -> None:
    code = (
        "import torch.distributed as dist; "
        "print(dist.is_initialized(), dist.get_rank(), dist.get_world_size(), dist.get_backend())"
    )
    result = probing(str(stalled.agent_pid), "eval", "--ranks", "all", code)
    assert result.returncode == 0, result.stderr
    for rank, pid in stalled.pids.items():
        assert f"── rank {rank} (PID {pid}) ──\nTrue {rank} 4 gloo\n" in result.stdout


def test_tables_gain_rank_columns(stalled: TorchrunJob) -> None:
    result = probing(str(stalled.agent_pid), "tables", "--ranks", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    backtrace = next(table for table in json.loads(result.stdout) if table["name"] == "python.backtrace")
    assert [column["name"] for column in backtrace["columns"]][-3:] == ["rank", "local_rank", "node"]


def test_a_rank_holding_the_gil_is_read_from_outside(gil_held: TorchrunJob) -> None:
    result = probing(
        str(gil_held.agent_pid), "query", "--ranks", "all", "--format", "json",
        "SELECT rank, func, source FROM python.backtrace WHERE depth = 0 AND is_main ORDER BY rank",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(row["rank"], row["source"]) for row in rows] == [(0, "agent"), (1, "py-spy"), (2, "agent")]
    assert rows[1]["func"] == "hold_the_gil"
    assert "rank 1: thread 'MainThread' holds the GIL in hold_the_gil" in result.stderr
    text = probing(str(gil_held.agent_pid), "backtrace", "--ranks", "all")
    assert text.returncode == 0, text.stderr
    assert (
        f"── rank 1 (PID {gil_held.pids[1]}) ──\n" + 'Thread "MainThread", main thread: holds the GIL'
        in text.stdout
    )


def test_a_table_the_gil_holder_cannot_give_is_a_partial_answer(gil_held: TorchrunJob) -> None:
    result = probing(
        str(gil_held.agent_pid), "query", "--ranks", "all", "--timeout", "1", "--format", "json",
        "SELECT DISTINCT rank FROM python.threads ORDER BY rank",
    )  # fmt: skip
    assert result.returncode == 14, result.stderr
    assert [row["rank"] for row in json.loads(result.stdout)] == [0, 2]
    assert f"rank 1 (PID {gil_held.pids[1]}):" in result.stderr


def test_a_killed_rank_is_named_and_the_others_answer() -> None:
    """torchrun is stopped first (it would tear the job down), then rank 3 is killed: the
    others, idle outside any collective, still answer; rank 3 is named as gone. 4 ranks: the
    three left fold into a range, 0-2."""
    with TorchrunJob("idle") as job:
        os.kill(job.agent_pid, signal.SIGSTOP)
        try:
            os.kill(job.pids[3], signal.SIGKILL)
            assert wait_until(lambda: _state(job.pids[3]) in ("Z", None))
            result = probing(
                str(job.pids[0]), "query", "--ranks", "all", "--format", "json",
                "SELECT DISTINCT rank FROM python.backtrace ORDER BY rank",
            )  # fmt: skip
            assert result.returncode == 14, result.stderr
            assert [row["rank"] for row in json.loads(result.stdout)] == [0, 1, 2]
            assert "probing: rank 3 (PID 0): not running: no process of the job has it" in result.stderr
            evaluated = probing(str(job.pids[1]), "eval", "--ranks", "all", "print('alive')")
            assert evaluated.returncode == 14
            assert evaluated.stdout.startswith(
                f"── ranks 0-2 (PIDs {job.pids[0]}, {job.pids[1]}, {job.pids[2]}) ──\nalive\n"
            )
        finally:
            os.kill(job.agent_pid, signal.SIGCONT)


def test_a_rank_that_dies_during_the_request_is_named() -> None:
    with TorchrunJob("idle", ranks=3) as job:
        os.kill(job.agent_pid, signal.SIGSTOP)
        try:
            code = "import os\nif os.environ['RANK'] == '1':\n    os._exit(3)\nprint('alive')"
            result = probing(str(job.agent_pid), "eval", "--force", "--ranks", "all", code)
            assert result.returncode == 14, result.stderr
            assert f"probing: rank 1 (PID {job.pids[1]}):" in result.stderr
            assert f"── ranks 0,2 (PIDs {job.pids[0]}, {job.pids[2]}) ──\nalive\n" in result.stdout
        finally:
            os.kill(job.agent_pid, signal.SIGCONT)


def test_not_a_job_and_absent_ranks_are_clear_errors(stalled: TorchrunJob, sleeper: object) -> None:
    plain = probing(str(sleeper.pid), "backtrace", "--ranks", "all")  # type: ignore[attr-defined]
    assert plain.returncode == 1
    assert "is not part of a distributed job" in plain.stderr and "hint:" in plain.stderr
    absent = probing(str(stalled.agent_pid), "query", "--ranks", "7", "SELECT 1")
    assert absent.returncode == 2
    assert "no rank 7" in absent.stderr and "ranks here: 0, 1, 2, 3" in absent.stderr
    malformed = probing(str(stalled.agent_pid), "eval", "--ranks", "one", "1")
    assert malformed.returncode == 2 and "--ranks takes `all` or a list" in malformed.stderr


def _state(pid: int) -> object:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_json_answers_name_each_rank_by_its_own_fields(stalled: TorchrunJob) -> None:
    """trace's status carries a `rank` of its own (0 until it has traced a step): the rank
    each answer came from is the job's, whatever the answer says."""
    result = probing(str(stalled.agent_pid), "trace", "status", "--ranks", "0,2", "--format", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["job"]["launcher_pid"] == stalled.agent_pid
    assert [(entry["rank"], entry["local_rank"], entry["pid"]) for entry in document["ranks"]] == [
        (0, 0, stalled.pids[0]), (2, 2, stalled.pids[2]),
    ]  # fmt: skip
