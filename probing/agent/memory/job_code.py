"""Which code is the job's own: not the standard library, site-packages or probing itself.

A leaked tensor is allocated inside torch but leaked by a line of `train.py`: the job's own
line is the one a user can act on, and the job's own modules are where its variables live.

Directories are compared whole, with their trailing separator: the job's files may sit in a
folder whose name starts like one of ours (a checkout named `probing`, `/usr/lib/python3.11-x`).
"""

from __future__ import annotations

import os
from typing import Tuple

# probing/agent: what the agent does is not the job's (this file is in agent/memory/).
AGENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A file of the agent starts with this; AGENT_DIR alone also starts `.../probing/agents/x.py`.
AGENT_PREFIX = os.path.join(AGENT_DIR, "")
# A path component, not a substring: `/srv/site-packages-notes/train.py` is the job's.
_INSTALLED = tuple(os.sep + name + os.sep for name in ("site-packages", "dist-packages"))


def library_roots() -> Tuple[str, ...]:
    """The standard library's directory, the agent's and probing's, each ending in a separator."""
    roots = {os.path.dirname(os.__file__), AGENT_DIR, os.path.dirname(AGENT_DIR)}
    return tuple(sorted(os.path.join(root, "") for root in roots))


def is_library(filename: str, roots: Tuple[str, ...]) -> bool:
    return (
        filename.startswith("<")
        or any(installed in filename for installed in _INSTALLED)
        or filename.startswith(roots)
    )
