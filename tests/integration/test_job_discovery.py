"""A distributed job found from any of its processes (`probing PID ranks`, `probing list`), on
real torchrun jobs (gloo, CPU). Two jobs run side by side for the whole module, so that every
test also checks that they never mix."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Dict, Iterator, List

import pytest

from probing.errors import ExitCode

from support import Target, TorchrunJob, probing, wait_until

pytest.importorskip("torch")

# The ranks reach the state under test just after saying ready (a collective entered, a shard
# waited for): a look may come a moment early, and is taken again until then.
SETTLE_S = 30.0


@pytest.fixture(scope="module")
def stalled() -> Iterator[TorchrunJob]:
    """Rank 1 of 3 waits forever in load_shard(); ranks 0 and 2 wait in all_reduce."""
    with TorchrunJob("stall", ranks=3, args=["--rank-at", "1"]) as job:
        yield job


@pytest.fixture(scope="module")
def idle(stalled: TorchrunJob) -> Iterator[TorchrunJob]:
    """Another job, started while the first runs (each job's answers must hold only its own):
    2 ranks that sleep outside any collective, so that one can die without the other failing."""
    with TorchrunJob("idle", ranks=2) as job:
        yield job


def ranks_json(pid: int, *args: str) -> Dict[str, Any]:
    result = probing(str(pid), "ranks", "--format", "json", *args)
    assert result.returncode == ExitCode.OK, result.stderr
    answer: Dict[str, Any] = json.loads(result.stdout)
    return answer


def places(answer: Dict[str, Any]) -> List[List[int]]:
    return [[rank["rank"], rank["local_rank"], rank["node"], rank["pid"]] for rank in answer["ranks"]]


def test_ranks_from_torchrun_and_from_a_rank_give_the_same_rows(
    stalled: TorchrunJob, idle: TorchrunJob
) -> None:
    expected = [[rank, rank, 0, pid] for rank, pid in sorted(stalled.pids.items())]
    from_torchrun = ranks_json(stalled.agent_pid)
    from_a_rank = ranks_json(stalled.pids[2])
    assert places(from_torchrun) == places(from_a_rank) == expected
    job = from_torchrun["job"]
    assert job["launcher_pid"] == stalled.agent_pid
    assert (job["world_size"], job["ranks_here"]) == (3, 3)
    assert job["run_id"] and job["rendezvous"].startswith("localhost:")
    assert all(rank["agent"] is False for rank in from_torchrun["ranks"])  # and none was attached


def test_two_jobs_on_one_machine_never_mix(stalled: TorchrunJob, idle: TorchrunJob) -> None:
    assert {rank["pid"] for rank in ranks_json(idle.pids[1])["ranks"]} == set(idle.pids.values())
    assert {rank["pid"] for rank in ranks_json(idle.agent_pid)["ranks"]} == set(idle.pids.values())
    assert {rank["pid"] for rank in ranks_json(stalled.pids[0])["ranks"]} == set(stalled.pids.values())


def test_list_shows_each_job_together_in_rank_order(stalled: TorchrunJob, idle: TorchrunJob) -> None:
    result = probing("list", "--format", "json")
    assert result.returncode == ExitCode.OK, result.stderr
    rows = json.loads(result.stdout)
    names = set()
    for job in (stalled, idle):
        members = [job.agent_pid, *(pid for _, pid in sorted(job.pids.items()))]
        at = [index for index, row in enumerate(rows) if row["pid"] in members]
        listed = [rows[index] for index in at]
        # torchrun, then its ranks in rank order, one after the other.
        assert [row["pid"] for row in listed] == members and at == list(range(at[0], at[0] + len(at)))
        assert [row["rank"] for row in listed] == [None, *sorted(job.pids)]
        assert [row["local_rank"] for row in listed] == [None, *sorted(job.pids)]
        assert len({row["job"] for row in listed}) == 1 and listed[0]["job"]
        names.add(listed[0]["job"])
    assert len(names) == 2
    assert [row["job"] for row in rows if row["pid"] == os.getpid()] == [None]  # this test, in no job
    table = probing("list").stdout.splitlines()
    assert table[0].split() == ["pid", "user", "python", "agent", "job", "rank", "local_rank", "command"]


def test_the_stalled_rank_stands_out_at_a_glance(stalled: TorchrunJob) -> None:
    """One look at each rank: rank 1 sleeps in load_shard, the others wait in all_reduce."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        answer = ranks_json(stalled.agent_pid)
        states = {rank["rank"]: rank["state"] for rank in answer["ranks"]}
        settled = states[1].startswith("sleeping in load_shard (ranks_job.py:") and all(
            states[rank].startswith("in torch.distributed.all_reduce from train (ranks_job.py:")
            for rank in (0, 2)
        )
        if settled or time.monotonic() > deadline:
            break
    assert settled, states
    assert all(rank["source"] == "py-spy" and rank["error"] is None for rank in answer["ranks"])
    text = probing(str(stalled.pids[1]), "ranks")
    assert text.returncode == ExitCode.OK, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"Job: run {answer['job']['run_id']}, torchrun PID {stalled.agent_pid}")
    assert lines[0].endswith("; world size 3, 3 ranks on this machine")
    assert lines[2].split() == ["rank", "local_rank", "node", "pid", "agent", "source", "state"]
    assert "sleeping in load_shard" in lines[5] and lines[5].split()[:4] == [
        "1",
        "1",
        "0",
        str(stalled.pids[1]),
    ]


def test_ranks_names_only_the_ranks_asked_for(stalled: TorchrunJob) -> None:
    result = probing(str(stalled.agent_pid), "ranks", "--ranks", "0,2", "--format", "csv")
    assert result.returncode == ExitCode.OK, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "rank,local_rank,node,pid,agent,source,state,error,host,endpoint,listen_error"
    assert [line.split(",")[:4] for line in lines[1:]] == [
        ["0", "0", "0", str(stalled.pids[0])],
        ["2", "2", "0", str(stalled.pids[2])],
    ]


def test_a_rank_the_job_has_not_is_a_usage_error(stalled: TorchrunJob) -> None:
    result = probing(str(stalled.pids[0]), "ranks", "--ranks", "9")
    assert result.returncode == ExitCode.USAGE
    assert "no rank 9" in result.stderr and "ranks here: 0, 1, 2" in result.stderr


def test_a_process_outside_any_job_is_a_clear_error() -> None:
    with Target("sleeper.py", via="plain") as plain:
        result = probing(str(plain.pid), "ranks")
    assert result.returncode == ExitCode.ERROR
    assert f"PID {plain.pid} is not part of a distributed job" in result.stderr
    assert "hint: `ranks` and --ranks work on a rank of a distributed job" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_dataloader_worker_is_taken_for_its_rank() -> None:
    """Ranks started by another launcher (here the test itself), each forking a worker that
    inherits its environment: from a worker, the job and its ranks are found."""
    common = {
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
        "TORCHELASTIC_RUN_ID": "forked",
    }
    first = Target("forker.py", via="plain", env={**common, "RANK": "0", "LOCAL_RANK": "0"})
    with first, Target("forker.py", via="plain", env={**common, "RANK": "1", "LOCAL_RANK": "1"}) as second:
        worker = int(second.ready_line().split("child=")[1])
        answer = ranks_json(worker)
        assert places(answer) == [[0, 0, 0, first.pid], [1, 1, 0, second.pid]]
        assert answer["job"]["launcher_pid"] == os.getpid() and answer["job"]["run_id"] == "forked"
        assert answer["ranks"][1]["state"].startswith("reading standard input in <module> (forker.py:")
        listed = {row["pid"]: row for row in json.loads(probing("list", "--format", "json").stdout)}
        assert (listed[worker]["rank"], listed[worker]["job"]) == (1, "forked")


def _process_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def test_a_rank_that_is_gone_shows_why_and_the_others_still_answer(idle: TorchrunJob) -> None:
    """Last of the module: it kills a rank of the idle job. torchrun is stopped first (it would
    tear the job down), so the dead rank stays its unreaped child."""
    os.kill(idle.agent_pid, signal.SIGSTOP)
    try:
        os.kill(idle.pids[1], signal.SIGKILL)
        assert wait_until(lambda: _process_state(idle.pids[1]) in ("Z", "gone"))
        result = probing(str(idle.pids[0]), "ranks", "--format", "json")
        assert result.returncode == ExitCode.PARTIAL, result.stderr
        answer = json.loads(result.stdout)
        assert answer["job"]["ranks_here"] == 1 and answer["job"]["ranks_gone"] == [1]
        live, gone = answer["ranks"]
        assert live["pid"] == idle.pids[0] and live["state"] and live["error"] is None
        assert (gone["rank"], gone["pid"], gone["state"]) == (1, None, None)
        assert gone["error"].startswith("not running: no process of the job has it on this machine")
        text = probing(str(idle.agent_pid), "ranks").stdout.splitlines()
        assert text[0].endswith("; world size 2, 1 rank on this machine, 1 gone")
        assert text[-1].split()[:4] == ["1", "1", "0", "-"] and "could not look: not running" in text[-1]
    finally:
        os.kill(idle.agent_pid, signal.SIGCONT)
