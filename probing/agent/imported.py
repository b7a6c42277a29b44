"""Which of the job's modules the agent may use: those the job has finished importing.

The agent never imports torch itself; it uses torch once the job has. But a process attached to
while it runs `import torch` has a torch in sys.modules that is half made (torch.compiler not yet
set, say): using it fails in ways that read as probing's bugs. importlib marks a module whose
import is under way (its spec's `_initializing`), on every CPython 3.8+.
"""

from __future__ import annotations

import sys
from typing import Any, Optional


def imported(name: str) -> Optional[Any]:
    """sys.modules[name] once its import has finished; None when it never ran or still runs."""
    module = sys.modules.get(name)
    if module is None or importing(name):
        return None
    return module


def importing(name: str) -> bool:
    """Whether the job is importing `name` right now (it is in sys.modules, half made)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None) if module is not None else None
    return bool(getattr(spec, "_initializing", False))
