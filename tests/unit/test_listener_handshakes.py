"""Who makes room for whom among the TCP listener's handshakes in progress (issue 25, item 10):
fair between sources, never a half-way handshake for a newcomer, refusals first, oldest first
within a source. The table alone, without sockets (tests/protocol/test_auth.py drives it with
real peers, tests/integration/hostile/test_tcp_flood.py floods a real job)."""

from __future__ import annotations

from typing import List

import pytest

from probing.agent.listener import handshakes
from probing.agent.listener.handshakes import Handshake, PendingHandshakes, source_of


def arrive(table: PendingHandshakes, source: str, count: int = 1, at: float = 0.0) -> List[Handshake]:
    entries = []
    for index in range(count):
        entry = Handshake(None, None, (source, 40000 + index), source, b"nonce", at + 3.0)
        table.add(entry)
        entries.append(entry)
    return entries


def test_a_source_that_fills_the_table_pays_for_its_own_newcomers_oldest_first() -> None:
    table = PendingHandshakes(4)
    flood = arrive(table, "10.0.0.9", 4)
    assert table.full()
    assert table.victim_for("10.0.0.9") is flood[0]
    table.remove(flood[0])
    assert not table.full()
    assert table.victim_for("10.0.0.9") is flood[1]


def test_a_newcomer_from_a_lighter_source_takes_a_slot_of_the_heaviest() -> None:
    table = PendingHandshakes(4)
    heavy = arrive(table, "10.0.0.9", 3)
    (light,) = arrive(table, "10.0.0.5")
    assert table.victim_for("10.0.0.7") is heavy[0]  # a new source
    assert table.victim_for("10.0.0.5") is heavy[0]  # a source with fewer
    assert table.victim_for("10.0.0.9") is heavy[0]  # the heaviest pays for its own
    assert light not in {table.victim_for(source) for source in ("10.0.0.7", "10.0.0.5", "10.0.0.9")}


def test_sources_with_equal_shares_each_pay_for_their_own() -> None:
    table = PendingHandshakes(4)
    first = arrive(table, "10.0.0.1", 2)
    second = arrive(table, "10.0.0.2", 2)
    assert table.victim_for("10.0.0.1") is first[0]
    assert table.victim_for("10.0.0.2") is second[0]


def test_a_half_way_handshake_is_never_the_newcomers_victim() -> None:
    table = PendingHandshakes(8)
    flood = arrive(table, "10.0.0.9", 8)
    assert table.progressing(flood[0]) and table.progressing(flood[1])
    assert table.victim_for("10.0.0.9") is flood[2]
    assert table.victim_for("10.0.0.3") is flood[2]
    assert table.counts() == {"in_progress": 8, "half_way": 2, "sources": 1}


def test_half_way_handshakes_are_capped_per_source_and_in_all() -> None:
    """A RESPONSE comes in one write: only a trickler stays half-way, and tricklers never fill
    the table (a quarter of it at most, PROGRESSING_PER_SOURCE of one source)."""
    table = PendingHandshakes(64)
    one = arrive(table, "10.0.0.9", 8)
    kept = [table.progressing(entry) for entry in one]
    assert kept == [True] * handshakes.PROGRESSING_PER_SOURCE + [False] * (
        8 - handshakes.PROGRESSING_PER_SOURCE
    )
    everyone = [arrive(table, f"10.0.1.{index}", 1)[0] for index in range(40)]
    kept = [table.progressing(entry) for entry in everyone]
    assert sum(kept) == 64 // 4 - handshakes.PROGRESSING_PER_SOURCE


def test_a_newcomer_is_turned_away_when_no_handshake_may_go() -> None:
    table = PendingHandshakes(4)
    (half_way,) = arrive(table, "10.0.0.9")
    assert table.progressing(half_way)
    others = arrive(table, "10.0.0.5", 3)
    # 10.0.0.5 holds the most and pays; 10.0.0.9's half-way handshake is never taken.
    assert {table.victim_for(source) for source in ("10.0.0.5", "10.0.0.1", "10.0.0.9")} == {others[0]}
    lone = PendingHandshakes(1)
    (only,) = arrive(lone, "10.0.0.9")
    assert lone.progressing(only)
    assert lone.victim_for("10.0.0.9") is None and lone.victim_for("10.0.0.1") is None


def test_a_refusal_waiting_to_be_read_goes_first() -> None:
    table = PendingHandshakes(4)
    light = arrive(table, "10.0.0.5")
    heavy = arrive(table, "10.0.0.9", 3)
    table.refused(light[0], deadline=0.2)
    assert table.victim_for("10.0.0.9") is light[0]
    table.remove(light[0])
    table.remove(light[0])  # twice is harmless
    assert len(table) == 3 and table.counts()["sources"] == 1
    assert heavy[0].state == handshakes.SILENT


def test_deadlines_come_in_arrival_order_and_refusals_keep_their_own() -> None:
    table = PendingHandshakes(8)
    early = arrive(table, "10.0.0.1", 2, at=0.0)
    late = arrive(table, "10.0.0.2", 2, at=1.0)
    assert table.next_deadline() == 3.0
    table.refused(late[1], deadline=1.2)
    assert table.next_deadline() == 1.2
    assert table.expired(1.5) == [late[1]]
    assert table.expired(3.5) == [*early, late[1]]
    for entry in table.expired(10.0):
        table.remove(entry)
    assert len(table) == 0 and table.next_deadline() is None
    assert table.counts() == {"in_progress": 0, "half_way": 0, "sources": 0}


@pytest.mark.parametrize(
    ("address", "source"),
    [
        (("10.0.0.1", 5000), "10.0.0.1"),
        (("::ffff:10.0.0.1", 5000, 0, 0), "10.0.0.1"),
        (("2001:db8:1:2:3:4:5:6", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:ffff::1", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("fe80::1%eth0", 5000, 0, 2), "fe80::/64"),
        ("a unix path", "a unix path"),
    ],
)
def test_a_peer_counts_under_its_ipv4_address_or_its_ipv6_64(address: object, source: str) -> None:
    assert source_of(address) == source


def test_the_table_never_takes_more_than_a_sixteenth_of_the_descriptor_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import resource

    for soft, expected in (
        (1024, 64),
        (256, handshakes.MIN_HANDSHAKES),
        (1 << 20, handshakes.MAX_HANDSHAKES),
    ):
        monkeypatch.setattr(resource, "getrlimit", lambda _which, soft=soft: (soft, soft))
        assert handshakes.capacity() == expected


def test_a_local_rank_that_is_no_number_moves_no_port() -> None:
    """str.isdigit() takes '²', which int() refuses: the job's environment is the job's."""
    from probing.agent.listener.address import parse_listen_address

    assert parse_listen_address("127.0.0.1:5000", {"LOCAL_RANK": "\u00b2"}) == ("127.0.0.1", 5000)
    assert parse_listen_address("127.0.0.1:5000", {"LOCAL_RANK": "3"}) == ("127.0.0.1", 5003)
