"""Shared fixtures. Every target process started here is killed when its test ends."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, List

import pytest

from support import Target

LAYERS = ("unit", "protocol", "integration")


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Each test carries the marker of its layer, the folder it is in: `pytest -m unit` runs the
    pure functions alone (seconds), `-m protocol` the wire format against scripted peers."""
    tests = Path(__file__).resolve().parent
    for item in items:
        layer = Path(str(item.fspath)).resolve().relative_to(tests).parts[0]
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))


@pytest.fixture(scope="session", autouse=True)
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Agents of the test targets put their sockets here, not in the user's /tmp/probing-UID."""
    directory = str(tmp_path_factory.mktemp("sockets"))
    previous = os.environ.get("PROBING_SOCKET_DIR")
    os.environ["PROBING_SOCKET_DIR"] = directory
    yield directory
    if previous is None:
        os.environ.pop("PROBING_SOCKET_DIR", None)
    else:
        os.environ["PROBING_SOCKET_DIR"] = previous


@pytest.fixture
def sleeper() -> Iterator[Target]:
    with Target("sleeper.py") as target:
        yield target
