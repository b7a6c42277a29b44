"""python.process_groups' progress from the Flight Recorder: torch's own counter of the last
completed collective, raised to the highest completed entry where torch's gloo let it fall back
(two worker threads each store the number of the one they finished; the slower one wins)."""

from probing.agent.pytorch.collectives import _raise_to_completed_entries


def entry(seq, pg="0", retired=True, p2p=False):
    """An entry as torch 2.13's `_dump_fr_trace` gives it for gloo (its state stays 'scheduled')."""
    return {"collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": p2p, "state": "scheduled",
            "retired": retired, "process_group": (pg, "default_pg")}  # fmt: skip


def test_a_counter_left_behind_is_raised_to_the_highest_completed_entry():
    progress = {"0": [11, None, 9]}
    _raise_to_completed_entries(progress, [entry(9), entry(10), entry(11, retired=False)])
    assert progress == {"0": [11, None, 10]}


def test_a_collective_not_completed_does_not_count():
    progress = {"0": [11, None, 10]}
    _raise_to_completed_entries(progress, [entry(10), entry(11, retired=False)])
    assert progress == {"0": [11, None, 10]}


def test_each_group_by_its_own_entries_and_point_to_point_ones_not_at_all():
    progress = {"0": [4, 3, 2], "1": [7, None, None]}
    _raise_to_completed_entries(progress, [entry(3, pg="0"), entry(6, pg="1"), entry(9, pg="1", p2p=True),
                                           entry(5, pg="2")])  # fmt: skip
    assert progress == {"0": [4, 3, 3], "1": [7, None, 6]}


def test_entries_that_are_not_what_torch_gives_are_passed_over():
    progress = {"0": [3, None, 1]}
    _raise_to_completed_entries(progress, [None, "x", {"collective_seq_id": "n"}, entry(2)])
    assert progress == {"0": [3, None, 2]}
