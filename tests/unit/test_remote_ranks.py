"""tcp:// targets and --endpoints as written, and the Job of local ranks merged with the ranks the
job's registry names on other nodes: no process, no agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from probing.client.tcp import endpoint_url, split_endpoint
from probing.engine.jobs.fanout import gather
from probing.engine.jobs.job import Job, Rank, choose
from probing.engine.jobs.remote import (
    NOT_LISTENING,
    merge_registry,
    parse_endpoints,
    rank_from_hello,
    registered_rank,
)
from probing.engine.target import Target, parse_address
from probing.errors import ExitCode, UsageError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tcp://127.0.0.1:29600", ("127.0.0.1", 29600)),
        ("node1:1", ("node1", 1)),
        ("tcp://[::1]:80", ("::1", 80)),
        ("tcp://node-3.cluster.local:65535", ("node-3.cluster.local", 65535)),
    ],
)
def test_endpoints_split_into_host_and_port(text: str, expected: Any) -> None:
    assert split_endpoint(text) == expected


@pytest.mark.parametrize(
    "text", ["tcp://", "tcp://host", "tcp://host:", "tcp://:80", "tcp://h:0", "tcp://h:65536", "tcp://h:8x",
             "tcp://a b:1", "tcp://h/x:1", "tcp://h:123456"],
)  # fmt: skip
def test_a_malformed_endpoint_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError):
        split_endpoint(text)


def test_a_tcp_target_is_remote_and_has_no_pid() -> None:
    assert parse_address("tcp://127.0.0.1:5") == (None, "tcp://127.0.0.1:5")
    assert endpoint_url("::1", 5) == "tcp://[::1]:5"
    target = Target("tcp://h:7")
    assert target.remote and target.pid is None
    with pytest.raises(UsageError, match="reading from outside works only on the rank's own node"):
        target.require_pid("--native")
    assert not Target("123").remote


def test_endpoints_from_a_list_and_from_a_file(tmp_path: Path) -> None:
    assert parse_endpoints("h1:1, h2:2,,h1:1") == ["tcp://h1:1", "tcp://h2:2"]
    listed = tmp_path / "endpoints"
    listed.write_text("# node 0\nh1:1\n\n  h2:2  # node 1\n")
    assert parse_endpoints(f"@{listed}") == ["tcp://h1:1", "tcp://h2:2"]
    for bad in ("", " , ", f"@{tmp_path / 'missing'}", "h1"):
        with pytest.raises(UsageError):
            parse_endpoints(bad)


LOCAL = Job("run", 10, "head:29500", 6, [Rank(0, 0, 0, 100), Rank(1, 1, 0, 101)])


def entry(number: int, **changes: Any) -> Dict[str, Any]:
    """The registry's entry of rank `number` on a job of 3 nodes of 2 ranks."""
    node = number // 2
    fields = {"rank": number, "local_rank": number % 2, "group_rank": node, "node": f"node{node}",
              "pid": 200 + number, "endpoint": f"10.0.0.{node}:{29600 + number % 2}"}  # fmt: skip
    fields.update(changes)
    return fields


def test_the_registry_adds_the_ranks_of_other_nodes() -> None:
    registry = {"ranks": [entry(rank) for rank in (0, 1, 2, 3)]}
    job = merge_registry(LOCAL, registry)
    assert [rank.pid for rank in job.ranks] == [100, 101]  # local ranks stay local, endpoint added
    assert [(rank.endpoint, rank.remote) for rank in job.ranks] == [
        ("10.0.0.0:29600", False),
        ("10.0.0.0:29601", False),
    ]
    reached = [rank for rank in job.remote if rank.unreachable is None]
    assert [(r.rank, r.local_rank, r.node, r.pid, r.host, r.endpoint) for r in reached] == [
        (2, 0, 1, 202, "node1", "10.0.0.1:29600"),
        (3, 1, 1, 203, "node1", "10.0.0.1:29601"),
    ]
    missing = [rank for rank in job.remote if rank.unreachable is not None]
    assert [(rank.rank, rank.local_rank, rank.node, rank.pid) for rank in missing] == [
        (4, 0, 2, 0),
        (5, 1, 2, 0),
    ]
    assert all(rank.unreachable == NOT_LISTENING for rank in missing)
    assert [rank.rank for rank in choose(job, "all")] == [0, 1, 2, 3, 4, 5]


def test_no_registry_leaves_every_other_rank_unreachable_with_why() -> None:
    job = merge_registry(LOCAL, None, "not reachable from this node: why")
    assert [(rank.rank, rank.unreachable) for rank in job.remote] == [
        (rank, "not reachable from this node: why") for rank in (2, 3, 4, 5)
    ]


@pytest.mark.parametrize(
    "bad",
    [
        "not a dict",
        entry(2, rank="2"),
        entry(2, rank=True),
        entry(2, pid=0),
        entry(2, endpoint="no port"),
        entry(2, endpoint="h:1\x1b[2J"),
        entry(2, endpoint=None),
        entry(9),  # beyond the world size
    ],
)
def test_a_registry_entry_that_is_no_rank_is_left_out(bad: Any) -> None:
    job = merge_registry(LOCAL, {"ranks": [bad]})
    assert all(rank.unreachable is not None for rank in job.remote)


def test_a_registry_that_is_no_object_is_no_registry() -> None:
    for registry in ({"ranks": "x"}, {"ranks": None}, {}):
        job = merge_registry(LOCAL, registry)
        assert len(job.remote) == 4 and all(rank.unreachable for rank in job.remote)
    assert registered_rank(entry(2, host_extra="ignored")) is not None


def test_a_single_node_job_is_left_as_it_is() -> None:
    whole = Job("run", 10, None, 2, [Rank(0, 0, 0, 100), Rank(1, 1, 0, 101)])
    assert merge_registry(whole, {"ranks": []}).remote == []


def test_a_hello_names_the_rank_it_is() -> None:
    described = {"rank": 3, "local_rank": 1, "group_rank": 1, "world_size": 4, "run_id": "r1"}
    info = {"pid": 7, "node": "node1", "rank": described}
    rank = rank_from_hello("tcp://h:1", info)
    assert (rank.rank, rank.local_rank, rank.node, rank.pid, rank.host, rank.endpoint, rank.remote) == (
        3, 1, 1, 7, "node1", "h:1", True,
    )  # fmt: skip
    assert (rank.world_size, rank.run_id) == (4, "r1")
    for bad in (
        {},
        {"rank": None},
        {"rank": {"rank": 4, "world_size": 4}},
        {"rank": {"rank": "0", "world_size": 1}},
    ):
        with pytest.raises(UsageError, match="no rank of a distributed job"):
            rank_from_hello("tcp://h:1", bad)


def test_an_unreachable_rank_is_missing_with_its_reason_and_the_answer_partial() -> None:
    ranks: List[Rank] = [Rank(0, 0, 0, 100), Rank(1, 1, 1, 0, unreachable=NOT_LISTENING)]
    gathered = gather(ranks, lambda rank: "answer", 5.0)
    assert [rank.rank for rank, _ in gathered.answers] == [0]
    assert [(each.rank.rank, each.error.message) for each in gathered.missing] == [(1, NOT_LISTENING)]
    assert gathered.exit_code() == ExitCode.PARTIAL
