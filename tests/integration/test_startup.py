"""What probing costs at start-up: nothing in a process without PROBING, and only the
standard library's C modules in `probing PID backtrace`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import List

import pytest

import probing

from support import PROBING, VENV_PYTHON, Target, interpreter_params

PACKAGE = Path(probing.__file__).parent
# Everything a target process may load: it must be valid Python 3.8.
LOADED_IN_TARGETS = [
    PACKAGE / "__init__.py",
    *sorted((PACKAGE / "protocol").glob("*.py")),
    PACKAGE / "procfs.py",
    PACKAGE / "bootstrap" / "sitecustomize.py",
    *sorted((PACKAGE / "agent").glob("*.py")),
]


def imported_modules(command: List[str]) -> List[str]:
    environment = {key: value for key, value in os.environ.items() if key != "PROBING"}
    environment["PYTHONPROFILEIMPORTTIME"] = "1"
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=60)
    return [
        line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    ]


def test_without_probing_set_nothing_of_probing_is_imported() -> None:
    modules = imported_modules([VENV_PYTHON, "-c", "pass"])
    assert "site" in modules
    assert not [module for module in modules if "probing" in module]


def test_backtrace_imports_nothing_heavy() -> None:
    with Target("sleeper.py") as target:
        modules = imported_modules([VENV_PYTHON, PROBING + "-python", str(target.pid), "backtrace"])
    assert "probing.client.connection" in modules
    heavy = {"duckdb", "click", "psutil", "numpy", "typing", "re", "json", "socket", "enum"}
    assert not heavy & set(modules), sorted(heavy & set(modules))


@pytest.mark.parametrize("python", interpreter_params())
def test_code_loaded_into_targets_is_valid_for_every_interpreter(python: str) -> None:
    check = "import sys\nfor path in sys.argv[1:]:\n    compile(open(path).read(), path, 'exec')"
    result = subprocess.run(
        [python, "-c", check, *map(str, LOADED_IN_TARGETS)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
