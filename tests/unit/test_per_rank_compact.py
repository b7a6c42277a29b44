"""What many ranks' answers read like at scale (render/per_rank.py): headings that count what a
thousand ranks are instead of listing them, one line per reason for the ranks that did not
answer, and one block per stack whether or not its source lines could be read."""

from __future__ import annotations

import io
from typing import List

from probing.cli.render.per_rank import heading, write_missing
from probing.engine.jobs.fanout import Missing
from probing.engine.jobs.job import Rank
from probing.errors import AgentTimeout, AgentUnreachable, RemoteError


def ranks(numbers: range, per_node: int = 64) -> List[Rank]:
    return [Rank(number, number % per_node, number // per_node, 1000 + number) for number in numbers]


def test_a_few_ranks_are_named_with_their_pids_many_are_counted() -> None:
    assert heading(ranks(range(3))) == "ranks 0-2 (PIDs 1000, 1001, 1002)"
    assert heading(ranks(range(8))).startswith("ranks 0-7 (PIDs 1000, ")
    many = [rank for rank in ranks(range(1024)) if rank.rank != 512]
    assert heading(many) == "ranks 0-511,513-1023 (1023 ranks on 16 nodes)"
    assert heading(ranks(range(9))) == "ranks 0-8 (9 ranks on 1 node)"


def test_ranks_missing_for_one_reason_are_one_line() -> None:
    frozen = AgentTimeout("no answer within 5 s")
    gone = AgentUnreachable("node 3's relay failed: connection reset", hint="look at node 3")
    raised = RemoteError(
        "ZeroDivisionError: division by zero", traceback="Traceback ...\nZeroDivisionError\n"
    )
    missing = [Missing(rank, frozen) for rank in ranks(range(64, 128))]
    missing += [Missing(rank, gone) for rank in ranks(range(192, 256))]
    missing += [Missing(ranks(range(7, 8))[0], raised)]
    err = io.StringIO()
    write_missing(missing, err)
    assert err.getvalue().splitlines() == [
        "probing: rank 7 (PID 1007): ZeroDivisionError: division by zero",
        "Traceback ...",
        "ZeroDivisionError",
        "probing: ranks 64-127 (64 ranks on 1 node): no answer within 5 s",
        "probing: ranks 192-255 (64 ranks on 1 node): node 3's relay failed: connection reset",
        "  hint: look at node 3",
    ]
