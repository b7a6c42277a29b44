"""The whole job's verdict (analysis/collectives.py, analysis/mismatches.py) and how it is printed
(cli/render/job.py), from what real torchrun jobs showed: tests/unit/data/job_*.json hold, per
rank of tests/targets/ranks_job.py (4 ranks, gloo), its `hang --format json` report and its Flight
Recorder as python.collectives / python.process_groups rows. No process is started here."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from probing.analysis.collectives import JobVerdict, RankView, job_verdict
from probing.analysis.mismatches import SAME_CALLS, flight_recorder_analyzer, mismatches
from probing.analysis.progress import HangReport, ThreadReport
from probing.cli.render.job import write_job_hang

DATA = Path(__file__).resolve().parent / "data"
ANALYZER = flight_recorder_analyzer()
# Both checks for mismatches: torch's analyzer where torch is importable, and ours.
CHECKS = [
    pytest.param(ANALYZER, id="flight-recorder",
                 marks=[pytest.mark.skipif(ANALYZER is None, reason="torch is not importable")]),
    pytest.param(None, id="probing"),
]  # fmt: skip


def report(data: Dict[str, Any]) -> HangReport:
    threads = [ThreadReport(**thread) for thread in data["threads"]]
    return HangReport(data["pid"], data["hung"], data["duration_s"], data["samples"], threads,
                      data["dataloader_worker"], data["reason"])  # fmt: skip


def job(scenario: str) -> List[RankView]:
    document = json.loads((DATA / f"job_{scenario}.json").read_text())
    return [
        RankView(
            rank["rank"],
            rank["local_rank"],
            rank["node"],
            rank["pid"],
            report(rank["report"]),
            "",
            rank["collectives"],
            rank["process_groups"],
        )  # fmt: skip
        for rank in document["ranks"]
    ]


def verdict_of(
    views: List[RankView], build_db: Any = None, window_start: Optional[float] = None
) -> JobVerdict:
    return job_verdict(views, window_start, lambda: build_db)


@pytest.mark.parametrize("build_db", CHECKS)
def test_a_stalled_rank_is_named_with_its_place_and_the_collective_the_others_wait_in(build_db: Any) -> None:
    verdict = verdict_of(job("stall"), build_db)
    assert verdict.hung and verdict.basis == "collectives"
    assert verdict.reason == (
        "rank 2 has not reached all_reduce #6 of process group 0 (default_pg) that ranks 0, 1, 3 wait in; "
        "it is in load_shard (ranks_job.py:38), sleeping"
    )
    [behind] = verdict.behind
    assert (behind.rank, behind.seq, behind.last_seq, behind.holds_gil) == (2, 6, 5, False)
    [waiting] = verdict.waiting
    assert (waiting.ranks, waiting.op, waiting.pg_id, waiting.seq) == ([0, 1, 3], "all_reduce", 0, 6)
    assert waiting.waited_s is not None and waiting.waited_s > 5
    assert verdict.mismatches == [] and verdict.missing == []


def test_a_rank_holding_the_gil_gave_no_collectives_and_is_placed_by_its_stack_from_outside() -> None:
    views = job("gil")
    assert views[2].collectives is None
    verdict = verdict_of(views, ANALYZER)
    [behind] = verdict.behind
    assert (behind.rank, behind.where, behind.holds_gil, behind.gil_holder) == (
        2, "hold_the_gil (ranks_job.py:43)", True, "MainThread",
    )  # fmt: skip
    assert behind.last_seq is None and behind.seq == 6
    assert verdict.reason.endswith("it is in hold_the_gil (ranks_job.py:43), holds the GIL, sleeping")
    assert verdict.waiting[0].ranks == [0, 1, 3]


@pytest.mark.parametrize("build_db", CHECKS)
def test_a_broadcast_where_the_others_all_reduce_is_a_mismatch_at_that_sequence_number(build_db: Any) -> None:
    verdict = verdict_of(job("mismatch"), build_db)
    assert verdict.hung and verdict.behind == []
    [mismatch] = verdict.mismatches
    assert (mismatch.pg_id, mismatch.seq, mismatch.kind) == (0, 6, "op")
    assert [(call.ranks, call.op) for call in mismatch.calls] == [
        ([0, 1, 3], "all_reduce"),
        ([2], "broadcast"),
    ]
    assert mismatch.source == ("flight_recorder" if build_db else "probing")
    assert verdict.reason == (
        "collective #6 of process group 0 (default_pg) does not match across ranks: "
        "ranks 0, 1, 3 call all_reduce, rank 2 calls broadcast"
    )
    assert [(waiting.ranks, waiting.op) for waiting in verdict.waiting] == [
        ([0, 1, 3], "all_reduce"), ([2], "broadcast"),
    ]  # fmt: skip


@pytest.mark.parametrize("build_db", CHECKS)
def test_a_mismatch_is_found_when_a_rank_buffer_starts_mid_run(build_db: Any) -> None:
    """A ring buffer that wrapped: rank 0 holds only the last three collectives."""
    views = job("mismatch")
    views[0] = views[0]._replace(collectives=views[0].collectives[-3:])  # type: ignore[index]
    [mismatch] = verdict_of(views, build_db).mismatches
    assert (mismatch.seq, [call.ranks for call in mismatch.calls]) == (6, [[0, 1, 3], [2]])


@pytest.mark.parametrize("build_db", CHECKS)
def test_other_sizes_at_the_same_sequence_number_are_a_mismatch_of_sizes(build_db: Any) -> None:
    views = job("mismatch")
    for row in views[2].collectives or []:
        if row["seq"] == 6:
            row.update(
                op="all_reduce", profiling_name="gloo:all_reduce", input_sizes="[[8]]", output_sizes="[[8]]"
            )
    [mismatch] = verdict_of(views, build_db).mismatches
    assert (mismatch.kind, mismatch.calls[1].ranks, mismatch.calls[1].input_sizes) == ("sizes", [2], [[8]])


@pytest.mark.parametrize("build_db", CHECKS)
def test_ranks_read_a_moment_apart_in_a_healthy_job_are_no_mismatch(build_db: Any) -> None:
    """Rank 0 completed #1186 where rank 1 still has it scheduled: torch's analyzer would call
    that a COLLECTIVE_STATE_MISMATCH; it is what a live job looks like."""
    views = job("healthy")
    states = {view.rank: view.collectives[-1]["state"] for view in views}  # type: ignore[index]
    assert "completed" in states.values() and "scheduled" in states.values()
    assert verdict_of(views, build_db).mismatches == []


def _last_created(views: List[RankView]) -> float:
    return min(max(row["time_created"] for row in view.collectives or []) for view in views)


def test_a_rank_that_looked_hung_is_forgiven_when_collectives_completed_on_every_rank_in_the_window() -> None:
    """Seen for real: a healthy rank sampled 4 times in its time.sleep(0.02) was 'hung' by its own
    verdict. Collectives completed on every rank while it was watched: the job progresses."""
    views = job("healthy")
    assert [view.report.hung for view in views] == [False, True, False, False]  # type: ignore[union-attr]
    forgiven = verdict_of(views, ANALYZER, window_start=_last_created(views) - 1.0)
    assert not forgiven.hung and forgiven.behind == [] and forgiven.waiting == []
    assert forgiven.reason == "rank 1 did not move, but collectives completed on every rank during the window"
    # Without the window's start nothing shows it: the rule falls back to any hung rank.
    assert verdict_of(views, ANALYZER).hung
    # Collectives that completed before the window are no excuse.
    assert verdict_of(views, ANALYZER, window_start=_last_created(views) + 60.0).hung


def test_a_job_whose_ranks_all_progressed_is_not_hung() -> None:
    views = job("healthy")
    views[1] = views[1]._replace(report=views[1].report._replace(hung=False))  # type: ignore[union-attr]
    verdict = verdict_of(views, ANALYZER)
    assert not verdict.hung and verdict.reason == "every rank progressed (ranks 0, 1, 2, 3)"


def test_a_busy_rank_that_never_reaches_the_collective_still_makes_the_job_hung() -> None:
    """Rank 2 moves (an endless Python loop), so it is not hung itself; the others are."""
    views = job("stall")
    moving = views[2].report._replace(hung=False, reason="thread 'MainThread' moved")  # type: ignore[union-attr]
    views[2] = views[2]._replace(report=moving)
    verdict = verdict_of(views, ANALYZER)
    assert verdict.hung and [rank.rank for rank in verdict.behind] == [2]


def test_a_rank_that_could_not_be_sampled_is_missing_with_its_reason() -> None:
    views = job("stall")
    views[3] = views[3]._replace(report=None, missing_reason="no answer within 5.0 s", collectives=None,
                                 process_groups=None)  # fmt: skip
    verdict = verdict_of(views, ANALYZER)
    assert [(missing.rank, missing.reason) for missing in verdict.missing] == [(3, "no answer within 5.0 s")]
    assert verdict.hung and [rank.rank for rank in verdict.behind] == [2]
    assert verdict.waiting[0].ranks == [0, 1]
    assert verdict.to_json()["missing"][0]["pid"] == views[3].pid


def test_without_any_collective_the_stacks_decide_who_waits_and_who_is_behind() -> None:
    views = [view._replace(collectives=None, process_groups=None) for view in job("stall")]
    verdict = verdict_of(views, ANALYZER)
    assert verdict.hung and verdict.basis == "stacks"
    assert [(rank.rank, rank.seq) for rank in verdict.behind] == [(2, None)]
    [waiting] = verdict.waiting
    assert (waiting.ranks, waiting.op, waiting.source) == ([0, 1, 3], "all_reduce", "stack")
    assert verdict.reason == (
        "rank 2 is not in a collective while ranks 0, 1, 3 wait in all_reduce; "
        "it is in load_shard (ranks_job.py:38), sleeping"
    )
    assert verdict.mismatch_check == "no two ranks gave collectives to compare"


def test_no_rank_sampled_is_no_verdict_of_hung() -> None:
    views = [view._replace(report=None, missing_reason="gone") for view in job("stall")]
    verdict = verdict_of(views, None)
    assert not verdict.hung and len(verdict.missing) == 4


def test_the_analyzer_failing_on_an_op_it_does_not_know_leaves_the_check_to_ours() -> None:
    views = job("mismatch")
    by_rank = {view.rank: copy.deepcopy(view.collectives or []) for view in views}
    for rows in by_rank.values():
        rows[0].update(op="fancy_reduce", profiling_name="gloo:fancy_reduce")
    found, check = mismatches(by_rank, lambda: ANALYZER or _raising)
    assert check.startswith("compared by probing (the Flight Recorder analyzer failed: ")
    assert [(mismatch.seq, mismatch.source) for mismatch in found] == [(6, "probing")]


def _raising(*args: Any) -> Any:
    raise AssertionError("fancy_reduce is not a supported operation")


def test_an_analyzer_that_exits_is_contained() -> None:
    def exits(*args: Any) -> Any:
        raise SystemExit(0)

    found, check = mismatches({view.rank: view.collectives or [] for view in job("mismatch")}, lambda: exits)
    assert "exited" in check and [mismatch.kind for mismatch in found] == ["op"]


def test_repeated_sequence_numbers_never_reach_the_analyzer() -> None:
    """On each collective recorded twice at one sequence number the analyzer looped for minutes,
    growing to gigabytes: such input is compared by ours."""
    by_rank = {view.rank: view.collectives or [] for view in job("stall")}
    by_rank[0] = by_rank[0] + [dict(by_rank[0][-1], record_id=by_rank[0][-1]["record_id"] + 1)]
    found, check = mismatches(by_rank, lambda: _raising)
    assert check == "compared by probing (sequence numbers repeat or go back)" and found == []


def _never_loaded() -> Any:
    raise AssertionError("the analyzer was loaded")


@pytest.mark.parametrize("scenario", ["stall", "healthy", "gil"])
def test_ranks_that_made_the_same_calls_never_load_torchs_analyzer(scenario: str) -> None:
    """Ours compared every call whole (ops whose tensors agree) and found them the same: torch's
    analyzer, comparing the same fields, would too; its import (2.5 s of CPU here) is not paid."""
    found, check = mismatches({view.rank: view.collectives or [] for view in job(scenario)}, _never_loaded)
    assert (found, check) == ([], SAME_CALLS)


def test_a_difference_or_an_op_compared_by_its_name_alone_is_left_to_torchs_analyzer() -> None:
    loaded: List[str] = []

    def load() -> Any:
        loaded.append("analyzer")
        return None

    assert mismatches({view.rank: view.collectives or [] for view in job("mismatch")}, load)[0]
    by_rank = {view.rank: copy.deepcopy(view.collectives or []) for view in job("stall")}
    for row in (row for rows in by_rank.values() for row in rows):
        row.update(op="all_to_all", profiling_name="gloo:all_to_all")
    found, check = mismatches(by_rank, load)
    assert loaded == ["analyzer", "analyzer"] and found == []
    assert check == "compared by probing (torch is not importable in this process)"


def test_the_text_says_the_verdict_first_then_behind_waiting_mismatches_and_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    views = job("mismatch")
    views[3] = views[3]._replace(report=None, missing_reason="timed out")
    write_job_hang(verdict_of(views, None), "text")
    out = capsys.readouterr().out
    assert out.startswith("The job is hung: collective #6 of process group 0 (default_pg) does not match")
    order = [out.index(heading) for heading in ("Waiting:", "Mismatched collectives", "Not sampled:")]
    assert order == sorted(order)
    write_job_hang(verdict_of(job("stall"), None), "text")
    out = capsys.readouterr().out
    assert out.index("Behind") < out.index("Waiting:") and "load_shard (ranks_job.py:38)" in out


def test_what_the_job_controls_is_made_inert_on_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    views = job("stall")
    hostile = views[2].report.threads[0]._replace(where="\x1b]0;owned\x07load\r(a.py:1)")  # type: ignore[union-attr]
    views[2] = views[2]._replace(report=views[2].report._replace(threads=[hostile]))  # type: ignore[union-attr]
    for row in views[0].collectives or []:
        row["op"] = "all_reduce\x1b[2J"
    write_job_hang(verdict_of(views, None), "text")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert "\\x1b]0;owned\\x07load\\r(a.py:1)" in out


def test_json_has_the_documented_keys_and_goes_through_the_writer(capsys: pytest.CaptureFixture[str]) -> None:
    write_job_hang(verdict_of(job("gil"), None), "json")
    document = json.loads(capsys.readouterr().out)
    assert set(document) == {"hung", "reason", "basis", "duration_s", "behind", "waiting", "mismatches",
                             "missing", "mismatch_check", "ranks"}  # fmt: skip
    assert document["behind"][0]["gil_holder"] == "MainThread"
    assert [rank["rank"] for rank in document["ranks"]] == [0, 1, 2, 3]


@pytest.mark.skipif(ANALYZER is None, reason="torch is not importable")
def test_the_analyzer_says_nothing_on_the_cli_streams(capfd: pytest.CaptureFixture[str]) -> None:
    """It logs every mismatch it meets ("Collective sequence number: 6 has errors", the stack...)
    to a handler of its own on stderr: that would land in the middle of our output."""
    found, _ = mismatches({view.rank: view.collectives or [] for view in job("mismatch")}, lambda: ANALYZER)
    assert [mismatch.source for mismatch in found] == ["flight_recorder"]
    assert capfd.readouterr() == ("", "")
