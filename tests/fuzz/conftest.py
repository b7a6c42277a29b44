"""The fuzz layer: every decoder of bytes a job controls, under one contract (harness.py says
which, and how to add a decoder). Every test here carries the `fuzz` marker (`pytest -m fuzz`
runs this layer alone, under a minute), and runs in plain `make test`."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterator, List

import pytest
from agents import TOKEN, FakeAgent, FakeTcpAgent
from hypothesis import configuration

from probing.protocol import auth

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# The harness writes no example database (derandomized runs use none, seeded runs one in memory),
# but hypothesis also caches what it learns of the code under test (constants, Unicode tables) in
# .hypothesis/ of the working directory: that goes outside the source tree.
configuration.set_hypothesis_home_dir(Path(tempfile.gettempdir()) / f"probing-fuzz-hypothesis-{os.getuid()}")


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        if "/fuzz/" in str(item.fspath):
            item.add_marker(pytest.mark.fuzz)


@pytest.fixture(scope="session", autouse=True)
def nothing_of_hypothesis_in_the_tree() -> Iterator[None]:
    """hypothesis' directory carries a .gitignore of its own, which hides it from the check of
    tests/conftest.py that a run writes nothing into the source tree: this one sees it."""
    places = {ROOT / ".hypothesis", HERE / ".hypothesis", Path.cwd() / ".hypothesis"}
    there = {place for place in places if place.exists()}
    yield
    made = sorted(str(place) for place in places - there if place.exists())
    assert not made, f"the fuzz tests wrote hypothesis' directory into the source tree: {made}"


@pytest.fixture(scope="module")
def fake_agent() -> Iterator[FakeAgent]:
    """An agent on this process's socket ($PROBING_SOCKET_DIR/PID.sock), for one test module."""
    agent = FakeAgent(os.environ["PROBING_SOCKET_DIR"])
    try:
        yield agent
    finally:
        agent.close()


@pytest.fixture(scope="module")
def tcp_agent() -> Iterator[FakeTcpAgent]:
    """An agent on loopback, and PROBING_TOKEN set to its token, for one test module."""
    previous = os.environ.get(auth.TOKEN_ENV)
    os.environ[auth.TOKEN_ENV] = TOKEN
    agent = FakeTcpAgent()
    try:
        yield agent
    finally:
        agent.close()
        if previous is None:
            os.environ.pop(auth.TOKEN_ENV, None)
        else:
            os.environ[auth.TOKEN_ENV] = previous
