"""python.process_groups' progress from the Flight Recorder: torch's own count of the last
completed collective, raised over the entries completed right after it where torch's gloo let
it fall back (two worker threads each store the number of the one they finished; the slower one
wins), and never past one still running."""

from probing.agent.pytorch.collectives import _raise_to_completed_entries
from probing.agent.pytorch.flight_recorder import compact


def entry(seq, pg="0", retired=True, p2p=False):
    """An entry as torch 2.13's `_dump_fr_trace` gives it for gloo (its state stays 'scheduled'),
    made the flat tuple the agent keeps of it."""
    return compact({"collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": p2p, "state": "scheduled",
                    "retired": retired, "process_group": (pg, "default_pg")})  # fmt: skip


def test_a_count_left_behind_is_raised_over_the_entries_completed_after_it():
    progress = {"0": [11, None, 9]}
    _raise_to_completed_entries(progress, [entry(9), entry(10), entry(11, retired=False)])
    assert progress == {"0": [11, None, 10]}


def test_never_past_a_collective_still_running():
    progress = {"0": [12, None, 9]}
    _raise_to_completed_entries(progress, [entry(10, retired=False), entry(11), entry(12)])
    assert progress == {"0": [12, None, 9]}


def test_a_count_never_goes_down():
    progress = {"0": [11, 10, 10]}
    _raise_to_completed_entries(progress, [entry(8), entry(11, retired=False)])
    assert progress == {"0": [11, 10, 10]}


def test_each_group_by_its_own_entries_and_point_to_point_ones_not_at_all():
    progress = {"0": [4, 2, 2], "1": [7, None, None]}
    entries = [
        entry(3, pg="0"),
        entry(1, pg="1"),
        entry(2, pg="1"),
        entry(3, pg="1", p2p=True),
        entry(5, pg="2"),
    ]
    _raise_to_completed_entries(progress, entries)
    assert progress == {"0": [4, 3, 3], "1": [7, None, 2]}


def test_no_entry_completed_leaves_an_unknown_count_unknown():
    progress = {"0": [3, None, None]}
    _raise_to_completed_entries(progress, [entry(1, retired=False)])
    assert progress == {"0": [3, None, None]}


def test_entries_that_are_not_what_torch_gives_are_passed_over():
    progress = {"0": [3, None, 1]}
    _raise_to_completed_entries(
        progress, [compact(None), compact("x"), compact({"collective_seq_id": "n"}), entry(2)]
    )
    assert progress == {"0": [3, None, 2]}
