"""--ranks as written (parse_ranks), the ranks of a job it names (choose), and the short names
`probing list` gives jobs (job_names): no process."""

from __future__ import annotations

from typing import Optional, Set

import pytest

from probing.engine.jobs.job import Job, Rank, choose, parse_ranks
from probing.engine.listing import job_names
from probing.errors import ExitCode, UsageError

JOB = Job(
    "run-7",
    4242,
    "localhost:29500",
    8,
    [Rank(rank, rank % 4, rank // 4, 100 + rank) for rank in (0, 1, 2, 3, 5)],
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("all", None),
        (" all ", None),
        ("0", {0}),
        ("0,2-3", {0, 2, 3}),
        ("3-3", {3}),
        (" 1 , 4-5 ", {1, 4, 5}),
        ("2,2,1-2", {1, 2}),
    ],
)
def test_ranks_are_all_or_a_list_of_numbers_and_ranges(text: str, expected: Optional[Set[int]]) -> None:
    assert parse_ranks(text) == expected


@pytest.mark.parametrize("text", ["", "x", "1-", "-1", "3-1", "1,,2", "0-2000000", "1.5", "all,1"])
def test_anything_else_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse_ranks(text)
    assert raised.value.exit_code == ExitCode.USAGE


def test_all_is_every_rank_found_here_in_rank_order() -> None:
    assert [rank.rank for rank in choose(JOB, "all")] == [0, 1, 2, 3, 5]


def test_a_list_gives_those_ranks_in_rank_order_whatever_the_order_written() -> None:
    assert [rank.pid for rank in choose(JOB, "5,0-1")] == [100, 101, 105]


def test_a_rank_not_here_is_a_usage_error_that_says_which_are() -> None:
    with pytest.raises(UsageError) as raised:
        choose(JOB, "4-9")
    message = raised.value.message
    assert "no rank 4, 6, 7, 8, 9" in message and "ranks here: 0, 1, 2, 3, 5" in message
    assert "world size 8" in message and "torchrun PID 4242" in message


def test_a_job_is_named_after_its_run_id_a_generated_one_cut_short() -> None:
    chosen = (1, "experiment-3", "h:1")
    generated = (2, "84dff134-44b3-4580-a98a-64571caa0323", "h:2")
    assert job_names([chosen, generated]) == {chosen: "experiment-3", generated: "84dff134"}


def test_jobs_without_a_run_id_of_their_own_are_named_after_torchrun() -> None:
    """torchrun's default run id is `none`; two jobs may share one that was given: neither may
    be shown under a name another job has too."""
    default, absent = (10, "none", "h:1"), (11, None, "h:2")
    same_a, same_b = (12, "exp", "h:3"), (13, "exp", "h:4")
    assert job_names([default, absent, same_a, same_b]) == {
        default: "torchrun 10",
        absent: "torchrun 11",
        same_a: "torchrun 12",
        same_b: "torchrun 13",
    }
