"""Shared fixtures. Every target process started here is killed when its test ends."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from support import Target


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
