"""The text of `stragglers` for a job of many ranks: a row for the stragglers and the latest of
the others, one line for the rest, the ranks not watched grouped by why; a few ranks, a row each."""

from __future__ import annotations

import io
import random
from typing import Dict, List

from probing.analysis.stragglers import Arrival, RankWatched, judge
from probing.cli.render.stragglers import SHOWN_RANKS, write_stragglers

START = 1_800_000_000.0
STEP_S = 0.05
STEPS = 60
WINDOW = (START - 0.1, START + STEPS * STEP_S + 1.0)


def _watched(rank: int, late: Dict[int, float]) -> RankWatched:
    noise = random.Random(rank)
    at = [START + seq * STEP_S + late.get(rank, 0.0) + noise.uniform(0, 0.002) for seq in range(STEPS)]
    arrivals = [Arrival("0", seq, "all_reduce", "[[64]]", at[seq], False) for seq in range(STEPS)]
    return RankWatched(rank, rank // 8, arrivals, [(("MainThread", "<module> (train.py:3)"), 10.0)])


def _text(views: List[RankWatched]) -> str:
    out = io.StringIO()
    write_stragglers(judge(views, WINDOW), "text", out)
    return out.getvalue()


def test_a_job_of_many_ranks_gets_a_row_for_its_straggler_and_one_line_for_the_rest() -> None:
    gone = "its agent did not answer"
    views = [_watched(rank, {37: 0.02}) for rank in range(60)]
    views += [RankWatched(rank, rank // 8, None, None, missing_reason=gone) for rank in range(60, 100)]
    text = _text(views)
    lines = text.splitlines()
    assert lines[1].startswith("Straggler: rank 37 is late"), text
    rows = [line for line in lines if line[:1].isdigit()]
    assert len(rows) == SHOWN_RANKS + 1, text  # the table's, and the missing ranks' one
    assert any(row.split()[0] == "37" for row in rows), text
    rest = next(line for line in lines if line.startswith("... and "))
    assert rest.startswith(f"... and {60 - SHOWN_RANKS} more (ranks "), rest
    assert "step 50" in rest and "`--format json` has every rank" in rest, rest
    assert "60-99  its agent did not answer" in text, text
    assert "(ranks 15-36,38-59)" in rest, rest  # the latest of the others: none late, so the first
    assert len(lines) < 40, text


def test_a_job_of_a_few_ranks_gets_a_row_for_each() -> None:
    text = _text([_watched(rank, {2: 0.02}) for rank in range(8)])
    rows = [line for line in text.splitlines() if line[:1].isdigit()]
    assert [row.split()[0] for row in rows] == [str(rank) for rank in range(8)], text
    assert "... and" not in text, text
