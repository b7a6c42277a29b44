"""--ranks across nodes: a real torchrun job over two simulated nodes (tests/support.py's
TwoNodeJob: PID, mount and UTS namespaces, gloo on CPU, node N's agents listening with a token
on 127.0.0.(N+2)). The CLI runs inside node 0, where node 1's processes and sockets do not
exist: every answer from ranks 2 and 3 came over authenticated TCP, found through the job's own
rendezvous store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from typing import Any, Dict, Iterator, List, Set

import pytest

from support import SIMULATED_NODES, TARGETS, TwoNodeJob, node_address, wait_until

pytestmark = [
    *SIMULATED_NODES,
    pytest.mark.timeout(300),  # two torchrun jobs start in the first test that needs each
]

FIRST_FRAMES = "SELECT node, rank, func, lineno FROM python.backtrace WHERE depth = 0"
WRONG_TOKEN = "not-the-token-of-this-job-0123456789"


@pytest.fixture(scope="module")
def stalled() -> Iterator[TwoNodeJob]:
    """Rank 3 (node1) sleeps in load_shard() before the all_reduce of step 5; ranks 0, 1 (node0)
    and 2 (node1) wait in it."""
    with TwoNodeJob("stall", args=["--rank-at", "3"]) as job:
        yield job


def _line_of(text: str) -> int:
    source = (TARGETS / "ranks_job.py").read_text().splitlines()
    return next(number for number, line in enumerate(source, 1) if line.strip() == text)


def _json(result: subprocess.CompletedProcess, expected_exit: int) -> Any:  # type: ignore[type-arg]
    assert result.returncode == expected_exit, result.stdout + result.stderr
    return json.loads(result.stdout)


def _endpoints(job: TwoNodeJob) -> Dict[int, str]:
    """rank -> "HOST:PORT" of its agent, as `ranks` on node 0 lists them."""
    document = _json(job.probing(0, "1", "ranks", "--format", "json"), 0)
    return {each["rank"]: each["endpoint"] for each in document["ranks"]}


def test_the_nodes_see_only_their_own_processes(stalled: TwoNodeJob) -> None:
    """The premise of every other test: node 0 has its two ranks and nothing of node 1."""
    for index, node in enumerate(stalled.nodes):
        seen = stalled.in_node(index, "sh", "-c", "hostname; cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        assert seen.stdout.splitlines()[0] == node.name
        assert seen.stdout.count(f"-u {TARGETS / 'ranks_job.py'}") == 2, (
            seen.stdout
        )  # torchrun starts ranks so
    assert sorted(stalled.nodes[0].pids) == [0, 1] and sorted(stalled.nodes[1].pids) == [2, 3]


def test_ranks_on_node0_lists_every_rank_with_its_node_and_endpoint(stalled: TwoNodeJob) -> None:
    document = _json(stalled.probing(0, "1", "ranks", "--format", "json"), 0)
    listed = {each["rank"]: each for each in document["ranks"]}
    assert sorted(listed) == [0, 1, 2, 3]
    for rank, each in listed.items():
        node = stalled.node_of(rank)
        assert (each["node"], each["host"], each["pid"]) == (node.index, node.name, node.pids[rank])
        assert each["endpoint"].startswith(f"{node.address}:"), each
        assert each["agent"] is True, each
    assert (document["job"]["ranks_here"], document["job"]["ranks_remote"]) == (2, [2, 3])
    text = stalled.probing(0, "1", "ranks")
    assert text.returncode == 0, text.stderr
    assert "world size 4, 2 ranks on this machine, 2 on other nodes" in text.stdout.splitlines()[0]


def _hang_verdict(job: TwoNodeJob) -> Dict[str, Any]:
    watched = job.probing(
        0, "1", "hang", "--ranks", "all", "--duration", "2", "--samples", "4", "--format", "json"
    )
    verdict: Dict[str, Any] = _json(watched, 11)
    return verdict


def test_hang_on_node0_names_the_stalled_rank_on_node1_and_its_line(stalled: TwoNodeJob) -> None:
    verdict = _hang_verdict(stalled)
    assert verdict["hung"] and verdict["basis"] == "collectives", verdict
    [behind] = verdict["behind"]
    assert (behind["rank"], behind["node"], behind["pid"]) == (3, 1, stalled.nodes[1].pids[3]), behind
    assert behind["where"] == f"load_shard (ranks_job.py:{_line_of('time.sleep(3600)')})"
    assert [waiting["ranks"] for waiting in verdict["waiting"]] == [[0, 1, 2]]
    assert verdict["missing"] == []
    # Rank 3 judged by itself too: its stacks and the CPU time its agent reads on node1 (node0's
    # /proc holds other processes under its PIDs), the sleeping main thread still.
    [rank_3] = [rank for rank in verdict["ranks"] if rank["rank"] == 3]
    assert rank_3["hung"] is True and "'MainThread'" in rank_3["reason"], rank_3
    text = stalled.probing(0, "1", "hang", "--ranks", "all", "--duration", "1", "--samples", "3")
    assert text.returncode == 11, text.stdout + text.stderr
    first = text.stdout.splitlines()[0]
    assert first.startswith("The job is hung: rank 3 has not reached all_reduce #6"), text.stdout
    assert f"it is in load_shard (ranks_job.py:{_line_of('time.sleep(3600)')})" in first


def test_hang_on_node0_names_the_host_of_the_stalled_rank(stalled: TwoNodeJob) -> None:
    """PIDs are per node: rank 3's PID on node1 is another process's PID on node0, where the user
    is. The verdict must say which machine it is on, as the headings of other answers do."""
    [behind] = _hang_verdict(stalled)["behind"]
    assert behind.get("host") == "node1", behind
    text = stalled.probing(0, "1", "hang", "--ranks", "all", "--duration", "1", "--samples", "3")
    behind_table = text.stdout.split("Behind")[1].split("Waiting")[0]
    rows = [line.split()[:5] for line in behind_table.splitlines()]
    assert ["3", str(stalled.nodes[1].pids[3]), "on", "node1", "load_shard"] in rows, text.stdout


@pytest.mark.parametrize("relays", ["relays", "PROBING_RELAY=0"])
def test_query_over_all_ranks_returns_rows_of_both_nodes(stalled: TwoNodeJob, relays: str) -> None:
    """The same rows whether node 1's ranks are asked through its relay (rank 2's agent) or each
    over its own connection."""
    env = {"PROBING_RELAY": None if relays == "relays" else "0"}
    result = stalled.probing(
        0, "-v", "1", "query", "--ranks", "all", "--format", "json", FIRST_FRAMES, env=env
    )
    rows: List[Dict[str, Any]] = _json(result, 0)
    relayed = f"node 1: its ranks are asked through its relay at tcp://{_endpoints(stalled)[2]}"
    assert (relayed in result.stderr) is (relays == "relays"), result.stderr
    assert {(row["rank"], row["node"]) for row in rows} == {(0, 0), (1, 0), (2, 1), (3, 1)}
    # The relay's threads (rank 2's, asking rank 2 and 3) are the agent's: in no stack.
    every = stalled.probing(0, "1", "query", "--ranks", "all", "--format", "json",
                            "SELECT DISTINCT file FROM python.backtrace", env=env)  # fmt: skip
    # The agent's own files (a clone in a folder named `probing` holds the job's files too).
    ours = ("/probing/agent/", "/probing/bootstrap/")
    assert not [row["file"] for row in _json(every, 0) if any(part in row["file"] for part in ours)]
    stuck = [row for row in rows if row["rank"] == 3 and row["func"] == "load_shard"]
    assert [row["lineno"] for row in stuck] == [_line_of("time.sleep(3600)")]
    assert {row["func"] for row in rows if row["rank"] != 3} >= {"all_reduce"}


def test_a_rank_its_relay_cannot_reach_is_asked_directly_and_still_checked(stalled: TwoNodeJob) -> None:
    """Rank 3's Unix socket moved aside on node 1 (where the relay, rank 2's agent, reaches its
    node's ranks): rank 3 is asked over its own TCP connection instead, and what answers there
    is checked to be rank 3 as any direct answer is; a look and a request that acts both work."""
    pids = stalled.nodes[1].pids
    path = os.path.join(stalled.socket_dir, f"{pids[3]}.sock")
    assert stalled.in_node(1, "mv", path, f"{path}.aside").returncode == 0
    try:
        looked = stalled.probing(0, "-v", "1", "query", "--ranks", "all", "--format", "json", FIRST_FRAMES)
        acted = stalled.probing(0, "-v", "1", "eval", "--ranks", "2-3", "import os; print(os.getpid())")
    finally:
        assert stalled.in_node(1, "mv", f"{path}.aside", path).returncode == 0
    rows: List[Dict[str, Any]] = _json(looked, 0)
    assert {(row["rank"], row["node"]) for row in rows} == {(0, 0), (1, 0), (2, 1), (3, 1)}
    assert "rank 3: its node's relay could not reach it" in looked.stderr, looked.stderr
    assert acted.returncode == 0, acted.stdout + acted.stderr
    assert "rank 3: its node's relay could not reach it" in acted.stderr, acted.stderr
    assert f"── rank 3 (PID {pids[3]} on node1) ──\n{pids[3]}\n" in acted.stdout, acted.stdout


def test_eval_over_all_ranks_runs_on_each_node(stalled: TwoNodeJob) -> None:
    result = stalled.probing(0, "1", "eval", "--ranks", "all", "import socket; print(socket.gethostname())")
    assert result.returncode == 0, result.stdout + result.stderr
    node0, node1 = (stalled.nodes[0].pids, stalled.nodes[1].pids)
    assert f"── ranks 0,1 (PIDs {node0[0]}, {node0[1]}) ──\nnode0\n" in result.stdout
    assert f"── ranks 2,3 (PIDs {node1[2]} on node1, {node1[3]} on node1) ──\nnode1\n" in result.stdout


def test_the_torch_and_memory_commands_reach_the_ranks_of_node1(stalled: TwoNodeJob) -> None:
    """trace, nan, memory and tables take --ranks like backtrace and query: node 1's ranks answer
    over TCP, each under its own rank, host and endpoint."""
    traced = _json(stalled.probing(0, "1", "trace", "status", "--ranks", "all", "--format", "json"), 0)
    assert sorted(entry["rank"] for entry in traced["ranks"]) == [0, 1, 2, 3]
    assert {entry["host"] for entry in traced["ranks"] if entry["rank"] >= 2} == {"node1"}
    checked = stalled.probing(0, "1", "nan", "status", "--ranks", "2-3")
    assert checked.returncode == 0 and "on node1" in checked.stdout, checked.stdout + checked.stderr
    memory = _json(stalled.probing(0, "1", "memory", "--ranks", "2-3", "--format", "json"), 0)
    assert [(entry["rank"], entry["host"]) for entry in memory["ranks"]] == [(2, "node1"), (3, "node1")]
    assert all(entry["rss_mb"] > 0 for entry in memory["ranks"])
    tables = stalled.probing(0, "1", "tables", "--ranks", "all")
    assert tables.returncode == 0 and "python.backtrace" in tables.stdout, tables.stdout + tables.stderr


def test_one_remote_agent_answers_directly_over_tcp_by_host_name(stalled: TwoNodeJob) -> None:
    port = _endpoints(stalled)[3].rsplit(":", 1)[1]
    result = stalled.probing(0, f"tcp://node1:{port}", "backtrace")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "in load_shard" in result.stdout


def test_a_wrong_token_is_refused_and_nothing_runs_on_node1(stalled: TwoNodeJob) -> None:
    endpoints = _endpoints(stalled)
    mark = f"open({stalled.node_path('evaluated-by-a-stranger')!r}, 'w').close()"
    for rank in (2, 3):
        refused = stalled.probing(
            0, f"tcp://{endpoints[rank]}", "eval", mark, env={"PROBING_TOKEN": WRONG_TOKEN}
        )
        assert refused.returncode == 5, refused.stdout + refused.stderr
        assert f"the agent at tcp://{endpoints[rank]} refused our token" in refused.stderr
    fanned = stalled.probing(0, "1", "eval", "--ranks", "2-3", mark, env={"PROBING_TOKEN": WRONG_TOKEN})
    assert fanned.returncode == 5, fanned.stdout + fanned.stderr  # every rank asked refused: their code
    for rank in (2, 3):
        assert (
            f"rank {rank} (PID {stalled.nodes[1].pids[rank]} on node1): the agent at tcp://{endpoints[rank]} "
            "refused our token" in fanned.stderr
        ), fanned.stderr
    assert stalled.in_node(1, "ls", stalled.private).stdout.split().count("evaluated-by-a-stranger") == 0
    # The job is unharmed: with the right token, both of node 1's ranks answer as before, and the
    # same code, allowed, does write in node 1's own files (the check above could not miss it).
    rows = _json(stalled.probing(0, "1", "query", "--ranks", "2-3", "--format", "json", FIRST_FRAMES), 0)
    assert {row["rank"] for row in rows} == {2, 3}
    allowed = stalled.probing(0, f"tcp://{endpoints[2]}", "eval", mark.replace("stranger", "friend"))
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "evaluated-by-a-friend" in stalled.in_node(1, "ls", stalled.private).stdout.split()
    assert "evaluated-by-a-friend" not in stalled.in_node(0, "ls", stalled.private).stdout.split()


def test_no_token_on_the_cli_is_a_usage_error(stalled: TwoNodeJob) -> None:
    endpoint = _endpoints(stalled)[2]
    unset = {"PROBING_TOKEN": None, "PROBING_TOKEN_FILE": "/nonexistent/probing-token"}
    result = stalled.probing(0, f"tcp://{endpoint}", "backtrace", env=unset)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"tcp://{endpoint} needs the job's token" in result.stderr


def test_a_node_that_does_not_listen_is_named_with_what_to_run_there_until_it_listens() -> None:
    sql = "SELECT DISTINCT rank FROM python.backtrace ORDER BY rank"
    with TwoNodeJob("idle", listening=(True, False)) as job:
        partial = job.probing(0, "1", "query", "--ranks", "all", "--format", "json", sql)
        assert partial.returncode == 14, partial.stdout + partial.stderr
        assert [row["rank"] for row in json.loads(partial.stdout)] == [0, 1]
        # One reason, one line for both ranks of node 1.
        [line] = [line for line in partial.stderr.splitlines() if line.startswith("probing: ranks 2,3 ")]
        assert "not reachable from this node: its agent does not listen" in line, partial.stderr
        assert "`probing PID listen`" in partial.stderr
        listened = job.probing(1, "1", "listen", "--ranks", "local", "--address", f"{job.nodes[1].address}:0")
        assert listened.returncode == 0, listened.stdout + listened.stderr
        assert listened.stdout.count(f"listens now on {job.nodes[1].address}:") == 2, listened.stdout
        job.listening = [0, 1, 2, 3]
        assert wait_until(job.all_registered, timeout=30, interval=0.2)
        whole = _json(job.probing(0, "1", "query", "--ranks", "all", "--format", "json", sql), 0)
        assert [row["rank"] for row in whole] == [0, 1, 2, 3]


def _named(stderr: str) -> Set[int]:
    """The ranks stderr names missing: `probing: rank 3 (...)`, `probing: ranks 2,3 (...)`."""
    named: Set[int] = set()
    for listed in re.findall(r"^probing: ranks? ([\d,]+) \(", stderr, re.M):
        named.update(int(number) for number in listed.split(","))
    return named


def _connected_to(address: str) -> bool:
    """A TCP connection to one of `address`'s ports is established (the shared network namespace)."""
    import psutil

    return any(
        connection.raddr and connection.raddr.ip == address and connection.status == psutil.CONN_ESTABLISHED
        for connection in psutil.net_connections("tcp4")
    )


def test_a_node_that_hangs_or_dies_mid_query_gives_a_partial_answer_naming_its_ranks() -> None:
    """Idle ranks (outside any collective), so that node 0 lives on without node 1. Frozen, node 1
    accepts connections and never answers: the query ends at its timeout. Killed while a query
    waits on it: the query ends at once. Both name ranks 2 and 3 and keep node 0's rows."""
    query = ("query", "--ranks", "all", "--timeout", "3", "--format", "json",
             "SELECT DISTINCT rank FROM python.backtrace ORDER BY rank")  # fmt: skip
    with TwoNodeJob("idle") as job:
        node1 = job.nodes[1]
        node1.freeze()
        started = time.monotonic()
        frozen = job.probing(0, "1", *query, timeout=60)
        assert frozen.returncode == 14, frozen.stdout + frozen.stderr
        assert time.monotonic() - started < 30
        assert [row["rank"] for row in json.loads(frozen.stdout)] == [0, 1]
        # One line for the node: its relay accepted and never answered.
        assert "probing: ranks 2,3 (" in frozen.stderr and "node 1's relay at" in frozen.stderr, frozen.stderr

        running = job.start_probing(0, "1", *query[:3], "--timeout", "30", *query[5:])
        try:
            assert wait_until(lambda: _connected_to(node1.address), timeout=20)
            node1.kill()
            killed_at = time.monotonic()
            stdout, stderr = running.communicate(timeout=25)
        finally:
            if running.poll() is None:
                running.kill()
                running.wait(10)
        assert time.monotonic() - killed_at < 20, "the query waited for its timeout on a dead node"
        assert running.returncode == 14, stdout + stderr
        assert [row["rank"] for row in json.loads(stdout)] == [0, 1]
        assert {2, 3} <= _named(stderr), stderr


@pytest.mark.parametrize("way", ["direct", "relayed"])
def test_a_stale_registry_entry_leaves_its_rank_missing_naming_what_answered(
    stalled: TwoNodeJob, way: str
) -> None:
    """Rank 3's entry in the job's store rewritten to name rank 2's endpoint (a rank gone, its
    port another agent's): what answers there is rank 2, so rank 3 is missing with that reason,
    and nothing is asked of rank 2 as if it were rank 3. Through node 1's relay, which asks a
    rank by its PID on the node, the entry names rank 2's PID too (the gone rank's PID reused)."""
    from datetime import timedelta

    import torch.distributed as dist

    endpoints = _endpoints(stalled)
    pids = stalled.nodes[1].pids
    store = dist.TCPStore(node_address(0), stalled.master_port, is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=5))  # fmt: skip
    key = f"probing/endpoint/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/3"
    original = store.get(key)
    stale = dict(json.loads(original), endpoint=endpoints[2])
    if way == "relayed":
        stale["pid"] = pids[2]
    store.set(key, json.dumps(stale))
    try:
        env = {"PROBING_RELAY": "0" if way == "direct" else None}
        result = stalled.probing(0, "1", "query", "--ranks", "all", "--format", "json", FIRST_FRAMES, env=env)
    finally:
        store.set(key, original)
    rows: List[Dict[str, Any]] = _json(result, 14)
    assert {row["rank"] for row in rows} == {0, 1, 2}  # rank 2's rows never pass for rank 3's
    if way == "direct":
        expected = f"tcp://{endpoints[2]} answered as rank 2 (PID {pids[2]}), not rank 3 (PID {pids[3]})"
    else:
        expected = f"tcp://{endpoints[2]} answered as rank 2, not rank 3"
    assert f"{expected}: a stale registry entry?" in result.stderr, result.stderr
