"""A query to an agent of this CLI's own version takes its table list from the hello (one round,
not a `tables` request first); any other agent is asked, as before."""

from __future__ import annotations

from typing import Any, Dict

import pytest

from probing import __version__
from probing.engine.query import described_in_hello
from probing.schema.tables import AGENT_TABLES


def hello(**fields: Any) -> Dict[str, Any]:
    return dict({"probing_version": __version__, "tables": sorted(AGENT_TABLES)}, **fields)


def test_the_same_version_is_described_here_as_the_agent_would() -> None:
    described = described_in_hello(hello())
    assert described == [AGENT_TABLES[name].describe() for name in sorted(AGENT_TABLES)]


@pytest.mark.parametrize(
    "info",
    [
        {},  # a relayed rank's hello has not come yet
        hello(probing_version="0.0.1"),
        hello(tables=["python.backtrace", "python.tables_of_the_future"]),
        hello(tables="python.backtrace"),
        hello(tables=[["python.backtrace"]]),
    ],
)
def test_another_agent_is_asked_for_its_tables(info: Dict[str, Any]) -> None:
    assert described_in_hello(info) is None
