"""Which code is the job's own: not the standard library, site-packages or probing itself.

A leaked tensor is allocated inside torch but leaked by a line of `train.py`: the job's own
line is the one a user can act on, and the job's own modules are where its variables live.
"""

from __future__ import annotations

import os
from typing import Tuple

# probing/agent: what the agent does is not the job's (this file is in agent/memory/).
AGENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def library_roots() -> Tuple[str, ...]:
    """The standard library's directory, the agent's and probing's."""
    roots = {os.path.dirname(os.__file__), AGENT_DIR, os.path.dirname(AGENT_DIR)}
    return tuple(sorted(roots))


def is_library(filename: str, roots: Tuple[str, ...]) -> bool:
    return (
        filename.startswith("<")
        or "site-packages" in filename
        or "dist-packages" in filename
        or filename.startswith(roots)
    )
