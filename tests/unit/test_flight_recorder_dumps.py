"""Which of torch's Flight Recorders the agent reads (agent/pytorch/flight_recorder.py): a CUDA
build keeps NCCL's entries apart from gloo's, and a job may use both."""

from __future__ import annotations

import pickle
from types import SimpleNamespace
from typing import Any, Dict, List

from probing.agent.pytorch.flight_recorder import OP, PG_ID, SEQ, read


def entry(seq: int, pg: str, backend: str) -> Dict[str, Any]:
    return {"collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False, "state": "completed",
            "process_group": (pg, f"{backend}_pg"), "profiling_name": f"{backend}:all_reduce"}  # fmt: skip


def recorder(entries: List[Dict[str, Any]], groups: Dict[str, Any]) -> Any:
    def dump(includeCollectives: bool, includeStackTraces: bool, onlyActive: bool) -> bytes:
        return pickle.dumps({"version": "2.10", "entries": entries if includeCollectives else [],
                             "pg_config": groups, "pg_status": {}})  # fmt: skip

    return dump


# torch._C._distributed_c10d's dump functions, as a build has them.
Bindings = SimpleNamespace


def test_an_nccl_jobs_entries_are_read_where_the_other_recorder_is_empty() -> None:
    """What an H200 run with torch 2.11 found: `_dump_fr_trace` answered, empty, and the NCCL
    process group's collectives were in `_dump_nccl_trace` alone."""
    bindings = Bindings(
        _dump_fr_trace=recorder([], {}),
        _dump_nccl_trace=recorder(
            [entry(1, "0", "nccl"), entry(2, "0", "nccl")], {"0": {"desc": "default_pg"}}
        ),
    )
    found = read(bindings, True)
    assert found is not None
    assert [(each[PG_ID], each[SEQ], each[OP]) for each in found["entries"]] == [
        ("0", 1, "all_reduce"),
        ("0", 2, "all_reduce"),
    ]
    assert found["pg_config"] == {"0": {"desc": "default_pg"}}


def test_a_job_with_gloo_and_nccl_groups_has_both_recorders_entries() -> None:
    bindings = Bindings(
        _dump_fr_trace=recorder([entry(1, "1", "gloo")], {"1": {"desc": "objects"}}),
        _dump_nccl_trace=recorder([entry(5, "0", "nccl")], {"0": {"desc": "default_pg"}}),
    )
    found = read(bindings, True)
    assert found is not None
    assert sorted((each[PG_ID], each[SEQ]) for each in found["entries"]) == [("0", 5), ("1", 1)]
    assert set(found["pg_config"]) == {"0", "1"}


def test_one_recorder_dumped_under_both_names_is_read_once() -> None:
    same = recorder([entry(1, "0", "nccl")], {"0": {}})
    found = read(Bindings(_dump_fr_trace=same, _dump_nccl_trace=same), True)
    assert found is not None and len(found["entries"]) == 1


def test_a_recorder_that_cannot_be_read_leaves_the_other() -> None:
    def broken(**_: Any) -> bytes:
        raise RuntimeError("no recorder built in")

    found = read(
        Bindings(_dump_fr_trace=broken, _dump_nccl_trace=recorder([entry(3, "0", "nccl")], {})), True
    )
    assert found is not None and [each[SEQ] for each in found["entries"]] == [3]
    assert read(Bindings(_dump_fr_trace=broken), True) is None
    assert read(Bindings(), True) is None
