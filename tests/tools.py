"""The tools outside this repository that some tests need, how each is found, and what a test
does without one: it is skipped, with the tool's name and what installs it, instead of failing
on it or waiting out a timeout for a target that could never start.

    @pytest.mark.needs("torch", "torchrun")     # checked before the test's fixtures start
    need("chromium")                            # or at the point of use

CI installs every tool (`make test` runs `make install` and `make browser`), so there a missing
tool is a broken set-up, not a reason to skip: with PROBING_TESTS_NEED_EVERY_TOOL=1 (.ci/run
sets it) `need` fails the test instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Dict, NamedTuple, Optional

import pytest

BIN = Path(sys.executable).parent
# `make browser` unpacks the offline trace viewer here (the Makefile's SPEEDSCOPE).
SPEEDSCOPE = Path(sys.prefix) / "share" / "speedscope-1.25.0"
STRICT_VARIABLE = "PROBING_TESTS_NEED_EVERY_TOOL"


class Tool(NamedTuple):
    found: Callable[[], bool]
    where: str  # where it is looked for
    install: str  # what installs it


def _module(name: str) -> Callable[[], bool]:
    return lambda: importlib.util.find_spec(name) is not None


def _beside_python(name: str) -> Callable[[], bool]:
    """An executable of this environment (the venv's bin/), where the CLI looks first too."""
    return lambda: os.access(BIN / name, os.X_OK) or shutil.which(name) is not None


def _on_path(name: str) -> Callable[[], bool]:
    return lambda: shutil.which(name) is not None


def _chromium() -> bool:
    return shutil.which("chromium") is not None or shutil.which("chromium-browser") is not None


TOOLS: Dict[str, Tool] = {
    "torch": Tool(_module("torch"), "the tests' Python", "`make install` (pip install torch)"),
    "torchrun": Tool(_beside_python("torchrun"), f"{BIN} or PATH", "comes with torch: `make install`"),
    "py-spy": Tool(_beside_python("py-spy"), f"{BIN} or PATH", "pip install py-spy (`make install`)"),
    "pystack": Tool(_module("pystack"), "the tests' Python", "pip install pystack (`make install`)"),
    "gdb": Tool(_on_path("gdb"), "PATH", "apt-get install gdb"),
    "chromium": Tool(_chromium, "PATH", "`make browser` (as root: apt-get install chromium)"),
    "tmux": Tool(_on_path("tmux"), "PATH", "`make browser` (as root: apt-get install tmux)"),
    "speedscope": Tool(lambda: (SPEEDSCOPE / "index.html").is_file(), str(SPEEDSCOPE), "`make browser`"),
    "unshare": Tool(_on_path("unshare"), "PATH", "util-linux's unshare (apt-get install util-linux)"),
}

# What the probing CLI prints when a tool it runs is missing, and which tool that is: a test
# that ran the CLI without it learns it there (support.probing checks every run's output).
CLI_SAYS_MISSING = {
    "py-spy is not installed": "py-spy",
    "pystack is needed to read core files": "pystack",
    "gdb is not installed": "gdb",
}


def missing_reason(name: str) -> Optional[str]:
    """Why the tool `name` cannot be used here, or None when it is found."""
    tool = TOOLS[name]
    if tool.found():
        return None
    return f"{name} is not installed (looked in {tool.where}): {tool.install} installs it"


def need(*names: str) -> None:
    """Skip the running test unless every named tool is found (fail instead under CI's
    PROBING_TESTS_NEED_EVERY_TOOL=1)."""
    for name in names:
        reason = missing_reason(name)
        if reason is None:
            continue
        if os.environ.get(STRICT_VARIABLE):
            pytest.fail(f"{reason} ({STRICT_VARIABLE} is set: every tool must be here)", pytrace=False)
        pytest.skip(reason)


def need_what_the_cli_missed(output: str) -> None:
    """Skip (see `need`) when the CLI's output says a tool it runs is missing."""
    for said, name in CLI_SAYS_MISSING.items():
        if said in output:
            need(name)


def need_what_a_target_missed(output: str) -> None:
    """Skip (see `need`) when a target that died before "ready" could not import a tool."""
    for name in ("torch", "pystack"):
        if f"No module named '{name}'" in output:
            need(name)
