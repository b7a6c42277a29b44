"""What a node's relay answers is the job's, untrusted (engine/jobs/relayed.py): a relay that
answers for fewer ranks than it was asked, points a rank's payload past its own, or sends a
reply that is not one fails those ranks with a clear error, and never another rank's answer.
The relay here is a stand-in object in this process (its real agent side is tested live in
tests/integration/test_relay.py); what is under test is the CLI's reading of its answers."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

import pytest

from probing.engine.jobs.job import NotTheRank, Rank
from probing.engine.jobs.relayed import NodeRelay, RelayedClient
from probing.errors import AgentUnreachable, ProbingError


def hello(rank: int) -> Dict[str, Any]:
    """The hello of rank `rank`'s agent (PID 100 + rank), as the relay passes it on."""
    about = {"pid": 100 + rank, "python_version": "3.11", "argv": ["train.py"], "rank": {"rank": rank}}
    return {"id": 1, "ok": True, "result": about}


def reply(result: Any) -> Dict[str, Any]:
    return {"id": 2, "ok": True, "result": result}


class StandInRelay:
    """Answers each `relay` request with what the test gives it."""

    def __init__(self, answer: Tuple[Any, bytearray]) -> None:
        self.answer = answer
        self.asked: List[Dict[str, Any]] = []

    def call(
        self, method: str, params: Optional[Dict[str, Any]] = None, timeout: Optional[float] = None
    ) -> Any:
        assert method == "relay"
        self.asked.append(params or {})
        return self.answer

    def close(self) -> None:
        pass


def ask_all(answer: Tuple[Any, bytearray], count: int = 2) -> List[Any]:
    """What each of `count` ranks of one node gets for a `ping` through a relay that answers so."""
    ranks = [Rank(number, number, 1, 100 + number, f"127.0.0.3:{4000 + number}", "node1", remote=True)
             for number in range(count)]  # fmt: skip
    relay = NodeRelay("127.0.0.3:4000", 1, count, lambda message: None)
    stand_in = StandInRelay(answer)
    relay._idle = [stand_in]  # type: ignore[list-item]
    outcomes: List[Any] = [None] * count

    def one(index: int) -> None:
        client = RelayedClient(relay, ranks[index], 5.0, lambda message: None)
        try:
            outcomes[index] = client.call("ping")[0]
        except ProbingError as error:
            outcomes[index] = error
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(stand_in.asked) == 1, "a node's ranks are asked in one request"
    return outcomes


def test_each_rank_reads_its_own_reply() -> None:
    entries = [
        {"pid": 100 + n, "hello": hello(n), "reply": reply({"rank": n}), "offset": 0, "size": 0}
        for n in (0, 1)
    ]
    assert ask_all(({"replies": entries}, bytearray())) == [{"rank": 0}, {"rank": 1}]


def test_a_relay_that_answers_for_fewer_ranks_fails_them_all() -> None:
    one = [{"pid": 100, "hello": hello(0), "reply": reply({"rank": 0}), "offset": 0, "size": 0}]
    outcomes = ask_all(({"replies": one}, bytearray()))
    assert all(isinstance(outcome, AgentUnreachable) for outcome in outcomes), outcomes
    assert "answered for 1 of 2 ranks" in outcomes[0].message


@pytest.mark.parametrize(
    "entry, why",
    [
        (
            {"pid": 101, "hello": hello(1), "reply": {"id": 7, "ok": True, "result": {}}},
            "answers another request",
        ),
        ({"pid": 101, "hello": hello(1), "reply": "not a reply"}, "unusable reply"),
        ({"pid": 101, "hello": {"id": 1, "ok": True, "result": []}, "reply": reply({})}, "hello"),
        (
            {"pid": 101, "error": "no answer in time", "sent": True},
            "asked through its node's relay: no answer in time",
        ),
        ("not an entry", "no answer"),
    ],
)
def test_a_bad_entry_fails_its_rank_only(entry: Any, why: str) -> None:
    good = {"pid": 100, "hello": hello(0), "reply": reply({"rank": 0}), "offset": 0, "size": 0}
    outcomes = ask_all(({"replies": [good, entry]}, bytearray()))
    assert outcomes[0] == {"rank": 0}
    assert isinstance(outcomes[1], ProbingError) and why in outcomes[1].message, outcomes[1]


def test_a_payload_pointed_past_the_relays_own_is_empty_not_another_ranks() -> None:
    """Rank 1's table said to lie past the end of the payload: it gets none (and so no table),
    not bytes of rank 0's."""
    table = {"table": {"name": "python.backtrace", "rows": 1, "columns": []}}
    entries = [
        {"pid": 100, "hello": hello(0), "reply": reply({"rank": 0}), "offset": 0, "size": 4},
        {"pid": 101, "hello": hello(1), "reply": reply(table), "offset": 2, "size": 400},
    ]
    relay = NodeRelay("127.0.0.3:4000", 1, 1, lambda message: None)
    relay._idle = [StandInRelay(({"replies": entries[1:]}, bytearray(b"rank")))]  # type: ignore[list-item]
    client = RelayedClient(
        relay, Rank(1, 1, 1, 101, "127.0.0.3:4001", "node1", remote=True), 5.0, lambda m: None
    )
    result, payload = client.call("ping")
    assert result == table and payload == bytearray()


def test_a_reply_from_an_agent_that_is_not_the_rank_is_never_read() -> None:
    """A stale registry entry: the PID the relay reached is now another rank's (or another
    job's). Its reply is refused with NotTheRank; the other rank's is read."""
    entries = [
        {"pid": 100, "hello": hello(0), "reply": reply({"rank": 0}), "offset": 0, "size": 0},
        {"pid": 101, "hello": hello(7), "reply": reply({"rank": 7}), "offset": 0, "size": 0},
    ]
    outcomes = ask_all(({"replies": entries}, bytearray()))
    assert outcomes[0] == {"rank": 0}
    assert isinstance(outcomes[1], NotTheRank) and "a stale registry entry" in outcomes[1].message


def test_a_request_that_acts_waits_for_the_ranks_hello_and_a_look_does_not() -> None:
    """`eval` goes out only after a `ping` proved the rank (as a direct connection's hello
    does); `backtrace` goes out at once and is checked by the hello that comes with it."""
    ping = {"pid": 100, "hello": hello(0), "reply": reply({}), "offset": 0, "size": 0}
    relay = NodeRelay("127.0.0.3:4000", 1, 1, lambda message: None)
    stand_in = StandInRelay(({"replies": [ping]}, bytearray()))
    relay._idle = [stand_in]  # type: ignore[list-item]
    rank = Rank(0, 0, 1, 100, "127.0.0.3:4000", "node1", remote=True)
    RelayedClient(relay, rank, 5.0, lambda m: None).call("eval", {"code": "1"})
    assert [asked["calls"][0]["method"] for asked in stand_in.asked] == ["ping", "eval"]
    stand_in.asked.clear()
    with pytest.raises(ProbingError, match="answer to 'backtrace'"):  # the stand-in's reply is a ping's
        RelayedClient(relay, rank, 5.0, lambda m: None).call("backtrace")
    assert [asked["calls"][0]["method"] for asked in stand_in.asked] == ["backtrace"]

    stand_in.answer = ({"replies": [dict(ping, hello=hello(3))]}, bytearray())
    with pytest.raises(NotTheRank):
        RelayedClient(relay, rank, 5.0, lambda m: None).call("eval", {"code": "import os; os._exit(1)"})
    assert [asked["calls"][0]["method"] for asked in stand_in.asked] == ["backtrace", "ping"]
