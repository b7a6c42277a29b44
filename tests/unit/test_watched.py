"""`hang` of a remote process reads the samples its agent took (engine/watched.py). The reply
is the job's, untrusted: a sample that names rows outside the table, counters that are not
counters, a second table put outside the payload or a table of another name fail the rank with a
BadReply, never a verdict on half a reply. The replies here are made by the agent's own `watch`
(agent/watch.py) run in this process, then spoiled."""

from __future__ import annotations

import copy
import threading
from typing import Any, Dict, Tuple

import pytest

from probing.agent.watch import watch
from probing.engine.watched import watch_remote
from probing.errors import BadReply, RequestRefused

TABLES = ("python.threads", "python.no_such_table")


class StandInServer:
    own_threads: set = set()  # type: ignore[type-arg]


class StandInClient:
    def __init__(self, answer: Tuple[Dict[str, Any], bytearray]) -> None:
        self.answer = answer

    def __enter__(self) -> StandInClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def call(self, method: str, params: Any = None, timeout: Any = None) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        assert method == "watch"
        return self.answer


class StandInTarget:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.logged: list = []  # type: ignore[type-arg]

    def connect(self, timeout: float) -> StandInClient:
        return StandInClient(self.answer)

    def log(self, message: str) -> None:
        self.logged.append(message)


@pytest.fixture(scope="module")
def reply() -> Tuple[Dict[str, Any], bytearray]:
    """This process watched by its own agent code: a thread waiting on an Event, three samples."""
    stop = threading.Event()
    waiter = threading.Thread(target=stop.wait, name="waiter")
    waiter.start()
    try:
        result, chunks = watch(StandInServer(), {"duration": 0.2, "samples": 3, "tables": list(TABLES)})
    finally:
        stop.set()
        waiter.join()
    return result, bytearray(b"".join(bytes(chunk) for chunk in chunks))


def test_each_sample_is_read_with_its_rows_and_counters(reply: Tuple[Dict[str, Any], bytearray]) -> None:
    watched = watch_remote(StandInTarget(reply), 0.2, 3, 5.0, TABLES)  # type: ignore[arg-type]
    assert watched is not None and len(watched.samples) == 3
    # The tables asked for, built after the window into the same reply; one the agent has not
    # is None, with a note of why.
    threads = watched.tables["python.threads"]
    assert threads is not None and {"MainThread", "waiter"} <= {row["name"] for row in threads}
    assert watched.tables["python.no_such_table"] is None
    assert any("no python.no_such_table" in note for note in watched.notes), watched.notes
    for sample in watched.samples:
        names = {row["thread_name"] for row in sample.rows}
        assert {"MainThread", "waiter"} <= names
        # Counters of every thread with a native id (a thread started with _thread.start_new_thread
        # by another test in this process may have none).
        assert set(sample.counters) == {row["native_id"] for row in sample.rows} - {None}
        # ... read for the threads of this test (another test's may end between rows and counters).
        ours = {row["native_id"] for row in sample.rows if row["thread_name"] in ("MainThread", "waiter")}
        assert all(isinstance(sample.counters[native][0], int) for native in ours)
        assert all(isinstance(sample.counters[native][1], int) for native in ours)
    # Spread over the 0.2 s window, not taken at once (later only by a loaded machine's delays).
    assert 0.1 <= watched.samples[2].taken - watched.samples[0].taken < 2.0


def spoiled(reply: Tuple[Dict[str, Any], bytearray], change: Any) -> Tuple[Dict[str, Any], bytearray]:
    result, payload = copy.deepcopy(reply[0]), bytearray(reply[1])
    change(result)
    return result, payload


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda r: r["samples"][1].update(rows=[0, 10**6]), "names rows"),
        (lambda r: r["samples"][1].update(rows=[5, 2]), "names rows"),
        (lambda r: r["samples"][1].update(rows="all"), "names rows"),
        (lambda r: r["samples"][0].update(counters={"main": [1, 2]}), "unreadable counters"),
        (lambda r: r["samples"][0].update(counters={"12": "busy"}), "unreadable counters"),
        (lambda r: r["samples"][0].pop("taken"), "says not when"),
        (lambda r: r.update(samples=r["samples"] * 40), "holds 120 samples"),
        (lambda r: r.update(samples=[]), "holds 0 samples"),
        (lambda r: r.pop("pid"), "names no PID"),
        (lambda r: r.update(tasks_offset=10**9), "outside its payload"),
        (lambda r: r["table"].update(name="python.threads"), "not python.backtrace"),
        (lambda r: r["tables"][0].update(offset=10**9), "puts python.threads outside"),
        (lambda r: r["tables"][0].update(name="python.backtrace"), "another table where python.threads"),
        (lambda r: r["tables"].pop(), "holds 1 of the 2 tables"),
    ],
)
def test_a_reply_that_does_not_hold_together_fails_the_rank(
    reply: Tuple[Dict[str, Any], bytearray], change: Any, why: str
) -> None:
    with pytest.raises(BadReply, match=why):
        watch_remote(StandInTarget(spoiled(reply, change)), 0.2, 3, 5.0, TABLES)  # type: ignore[arg-type]


def test_an_agent_without_watch_is_sampled_request_by_request() -> None:
    older = StandInTarget(RequestRefused("unknown method 'watch'; methods: backtrace, hello"))
    assert watch_remote(older, 1.0, 3, 5.0) is None  # type: ignore[arg-type]
    assert "request by request" in older.logged[0]
    with pytest.raises(RequestRefused):
        watch_remote(StandInTarget(RequestRefused("busy")), 1.0, 3, 5.0)  # type: ignore[arg-type]
