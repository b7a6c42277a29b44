"""The hostile-conditions layer: the ways a loaded job, a hostile job, a hostile peer or
another user could make probing harm the process it inspects, each as a bounded test on real
processes. Every test here carries the `hostile` marker (`pytest -m hostile` runs this layer).
"""

from __future__ import annotations

from typing import List

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        if "/hostile/" in str(item.fspath):
            item.add_marker(pytest.mark.hostile)
