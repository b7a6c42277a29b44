"""Every byte the CLI prints goes through probing/cli/render/: the command modules, the engine
and the run watchdog never touch the standard streams (checked over their source)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List

import pytest

import probing

PACKAGE = Path(probing.__file__).parent
RENDER = PACKAGE / "cli" / "render"
STREAMS = {"stdout", "stderr", "__stdout__", "__stderr__"}
PRINTING_CALLS = {"print", "input"}


def checked_modules() -> List[Path]:
    modules = [*(PACKAGE / "cli").rglob("*.py"), *(PACKAGE / "engine").rglob("*.py")]
    modules.append(PACKAGE / "launch" / "watchdog.py")
    return sorted(path for path in modules if RENDER not in path.parents)


def writes(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in STREAMS:
            if isinstance(node.value, ast.Name) and node.value.id == "sys":
                yield f"line {node.lineno}: sys.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module == "sys":
            for alias in node.names:
                if alias.name in STREAMS:
                    yield f"line {node.lineno}: from sys import {alias.name}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in PRINTING_CALLS:
                yield f"line {node.lineno}: {node.func.id}()"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) == (
                "os",
                "write",
            ):
                yield f"line {node.lineno}: os.write()"


def test_the_check_finds_each_kind_of_write() -> None:
    source = (
        "import sys, os\nsys.stdout.write('x')\nprint(1)\ninput()\nos.write(1, b'')\nfrom sys import stderr\n"
    )
    assert len(list(writes(ast.parse(source)))) == 5


@pytest.mark.parametrize("path", checked_modules(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_only_the_renderer_writes_to_the_terminal(path: Path) -> None:
    found = list(writes(ast.parse(path.read_text(), str(path))))
    assert not found, f"{path.relative_to(PACKAGE)} writes itself (render must): {found}"


def test_the_cli_side_imports_nothing_of_the_agent() -> None:
    """The CLI builds its own tables (process.stats) without the agent's column builders."""
    for folder in ("cli", "engine", "sql", "client", "launch"):
        for path in (PACKAGE / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom):
                    module = "." * node.level + (node.module or "")
                    assert "agent" not in module.split("."), f"{path.relative_to(PACKAGE)}: {module}"
