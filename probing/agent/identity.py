"""How the agent names the process it runs in (hello, process.info, a repl's banner)."""

from __future__ import annotations

import os
import sys
from typing import Optional


def python_version() -> str:
    """'3.11.4', or '3.13.0rc2' for a pre-release."""
    info = sys.version_info
    text = f"{info.major}.{info.minor}.{info.micro}"
    if info.releaselevel != "final":
        text += f"{info.releaselevel[0]}{info.serial}"
    return text


def working_directory() -> Optional[str]:
    """The job's current directory; None when it was removed under it."""
    try:
        return os.getcwd()
    except OSError:
        return None
