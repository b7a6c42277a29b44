"""What answers on a remote rank's endpoint must be that rank of that job; the registry is asked
of the local agents at once, within one deadline; `listen` hands the CLI's token only to its
own user's processes. No process, no agent: fake clients."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import pytest

from probing.engine import listen
from probing.engine.jobs import remote as job_remote
from probing.engine.jobs.job import Job, NotTheRank, Rank, identity_mismatch
from probing.engine.jobs.remote import ask_registry, one_job, rank_from_hello
from probing.engine.target import Target
from probing.errors import AgentTimeout, UsageError

RANK_3 = Rank(3, 1, 1, 777, "10.0.0.1:29601", "node1", remote=True, run_id="run-Y", world_size=4)


def hello(rank: int = 3, run: Optional[str] = "run-Y", world: int = 4, pid: int = 777) -> Dict[str, Any]:
    return {"pid": pid, "rank": {"rank": rank, "world_size": world, "run_id": run}}


def test_the_rank_expected_answers() -> None:
    assert identity_mismatch(RANK_3, "tcp://h:1", hello()) is None
    # Only what both sides know is compared: an agent without a run id, a rank without a PID.
    assert identity_mismatch(RANK_3, "tcp://h:1", hello(run=None)) is None
    unknown = Rank(3, 1, 1, 0, "h:1", remote=True)
    assert identity_mismatch(unknown, "tcp://h:1", hello(run="other", world=8, pid=5)) is None


@pytest.mark.parametrize(
    ("info", "why"),
    [
        (hello(rank=5, run="run-X"), "tcp://h:1 answered as rank 5 of run run-X, not rank 3 of run run-Y"),
        (hello(rank=5), "tcp://h:1 answered as rank 5, not rank 3: a stale registry entry?"),
        (hello(world=8), "answered as rank 3 (world size 8), not rank 3 (world size 4)"),
        (hello(pid=12), "answered as rank 3 (PID 12), not rank 3 (PID 777)"),
        ({"pid": 777, "rank": None}, "answered as no rank of a distributed job, not rank 3"),
        ({"rank": {"rank": "3"}}, "answered as no rank of a distributed job, not rank 3"),
    ],
)
def test_another_agent_on_the_endpoint_is_named_for_what_it_is(info: Dict[str, Any], why: str) -> None:
    mismatch = identity_mismatch(RANK_3, "tcp://h:1", info)
    assert mismatch is not None and why in mismatch, mismatch


class FakeClient:
    """A client whose agent says `info` in its hello; records what was asked of it."""

    def __init__(self, info: Dict[str, Any]) -> None:
        self.info: Dict[str, Any] = {}
        self.hello = info
        self.asked: List[str] = []
        self.closed = False

    def call(self, method: str, params: Any = None, timeout: Optional[float] = None) -> Any:
        self.asked.append(method)
        self.info = self.hello
        return {}, bytearray()

    def close(self) -> None:
        self.closed = True


class FakeAgents:
    """Stands in for engine.target's Client: each connection's agent says the next of `hellos`."""

    def __init__(self) -> None:
        self.hellos: List[Dict[str, Any]] = []
        self.made: List[FakeClient] = []

    def __call__(self, path: str, timeout: float, log: Any = None, **_: Any) -> FakeClient:
        self.made.append(FakeClient(self.hellos.pop(0)))
        return self.made[-1]


def test_a_remote_rank_target_is_checked_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    agents = FakeAgents()
    monkeypatch.setattr("probing.engine.target.Client", agents)
    agents.hellos.append(hello(rank=5, run="run-X"))
    target = Target("tcp://10.0.0.1:29601", rank=RANK_3)
    with pytest.raises(NotTheRank, match="answered as rank 5 of run run-X, not rank 3 of run run-Y"):
        target.connect(5.0)
    assert agents.made[0].asked == ["ping"] and agents.made[0].closed
    agents.hellos.append(hello())
    connected: object = target.connect(5.0)
    assert connected is agents.made[1] and not agents.made[1].closed
    # A tcp:// target the user names (no rank expected) is whatever answers there.
    agents.hellos.append(hello(rank=5))
    Target("tcp://10.0.0.1:29601").connect(5.0)
    assert agents.made[2].asked == []


def test_endpoints_of_two_jobs_or_two_of_one_rank_are_a_usage_error() -> None:
    def rank(url: str, number: int, run: Optional[str] = "r", world: int = 4) -> Rank:
        return rank_from_hello(url, hello(number, run, world))

    assert one_job({"tcp://a:1": rank("tcp://a:1", 0), "tcp://b:1": rank("tcp://b:1", 1)}) == ("r", 4)
    with pytest.raises(UsageError, match=r"--endpoints name ranks of more than one job \(tcp://a:1: run r"):
        one_job({"tcp://a:1": rank("tcp://a:1", 0), "tcp://b:1": rank("tcp://b:1", 1, run="s")})
    with pytest.raises(UsageError, match="world size 8"):
        one_job({"tcp://a:1": rank("tcp://a:1", 0), "tcp://b:1": rank("tcp://b:1", 1, world=8)})
    with pytest.raises(UsageError, match="more than one job"):
        one_job({"tcp://a:1": rank("tcp://a:1", 0), "tcp://b:1": rank("tcp://b:1", 1, run=None)})
    with pytest.raises(UsageError, match="tcp://a:1 and tcp://b:1 both answered as rank 0"):
        one_job({"tcp://a:1": rank("tcp://a:1", 0), "tcp://b:1": rank("tcp://b:1", 0)})


LOCAL = Job("run", 10, "head:29500", 6, [Rank(0, 0, 0, 100), Rank(1, 1, 0, 101), Rank(2, 2, 0, 102)])


class RegistryClient:
    """A local agent asked `endpoints`: rank 0's store hangs past any timeout, rank 1's fails,
    rank 2's answers."""

    release: threading.Event

    def __init__(self, path: str, timeout: float, log: Any = None, pid: int = 0) -> None:
        self.pid = pid

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def call(self, method: str, params: Any = None, timeout: Optional[float] = None) -> Any:
        if self.pid == 100:
            self.release.wait(30)
            raise AgentTimeout("the store did not answer")
        if self.pid == 101:
            raise AgentTimeout("the store did not answer within 4 s")
        return {"ranks": [], "world_size": 6}, bytearray()


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(job_remote, "locate_socket", lambda pid, log: f"/sock/{pid}")
    monkeypatch.setattr(job_remote, "Client", RegistryClient)
    monkeypatch.setattr(RegistryClient, "release", threading.Event(), raising=False)
    yield
    RegistryClient.release.set()


def test_the_registry_is_asked_of_the_local_agents_at_once(registry: None) -> None:
    started = time.monotonic()
    result, why = ask_registry(LOCAL, 5.0, lambda message: None)
    assert result == {"ranks": [], "world_size": 6}
    assert why == job_remote.NOT_LISTENING  # for the ranks the registry does not name
    assert time.monotonic() - started < 2.0  # not after rank 0's 5 s


def test_agents_that_all_fail_or_hang_end_within_the_one_timeout(registry: None) -> None:
    stuck = Job("run", 10, None, 6, LOCAL.ranks[:2])
    started = time.monotonic()
    result, why = ask_registry(stuck, 1.0, lambda message: None)
    assert result is None and time.monotonic() - started < 1.0 + job_remote.JOIN_SLACK_S + 0.5
    assert why == f"{job_remote.UNREADABLE_REGISTRY} (the store did not answer within 4 s)"
    only_hung = Job("run", 10, None, 6, LOCAL.ranks[:1])
    result, why = ask_registry(only_hung, 0.5, lambda message: None)
    assert result is None and "no agent of this node gave it within 0.5 s" in why


def test_listen_hands_the_cli_token_only_to_the_cli_user_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBING_TOKEN", "the-cli-token-0123456789")
    monkeypatch.setattr("os.geteuid", lambda: 0)
    logged: List[str] = []
    monkeypatch.setattr(listen, "effective_uid", lambda pid: 0)
    assert listen.token_for(Target("1234", logged.append)) == "the-cli-token-0123456789"
    monkeypatch.setattr(listen, "effective_uid", lambda pid: 1000)
    assert listen.token_for(Target("1234", logged.append)) is None
    assert logged[0] == "our token goes with the request (the target runs as our user)"
    assert logged[1:] == [
        "the target runs as uid 1000, not as ours (0): our token is not sent; its agent uses the job's own "
        "(PROBING_TOKEN in its environment, or its user's token file)"
    ]
    assert listen.token_for(Target("tcp://h:1")) is None
