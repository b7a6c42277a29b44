"""The architecture of DESIGN.md, checked on the source: who may import whom, no import circles,
no module over ~400 lines.

Every import counts wherever it is written (at the top, inside a function, under a `try`): an
import inside a function that exists to dodge a circle is still a circle. Imports under
`if TYPE_CHECKING:` never run; they count for the layering (an agent module must not even name a
CLI type) but not for circles, since they are how a module names a type of a module that imports
it without either depending on the other at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Set, Tuple

import probing

PACKAGE = Path(probing.__file__).resolve().parent
MAX_LINES = 400


class Edge(NamedTuple):
    target: str
    line: int
    type_only: bool  # under `if TYPE_CHECKING:`
    top_level: bool  # runs when the module is imported (not inside a function)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: Dict[str, Path] = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[Tuple[ast.AST, bool, bool]]:
    """(import node, under TYPE_CHECKING, at module level) for every import in the tree."""

    def walk(node: ast.AST, type_only: bool, top_level: bool) -> Iterator[Tuple[ast.AST, bool, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, type_only, top_level
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.body:
                    yield from walk(ast.Module(body=[statement], type_ignores=[]), True, top_level)
                for statement in child.orelse:
                    yield from walk(ast.Module(body=[statement], type_ignores=[]), type_only, top_level)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, type_only, False)
            else:
                yield from walk(child, type_only, top_level)

    yield from walk(tree, False, True)


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".")
    if not MODULES[module].name == "__init__.py":
        package.pop()
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def edges_of(module: str) -> List[Edge]:
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    edges = []
    for node, type_only, top_level in _imports(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            assert isinstance(node, ast.ImportFrom)
            base = _resolve(module, node)
            # `from package import name` imports the submodule when `name` is one.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names
            ]
        edges += [Edge(target, node.lineno, type_only, top_level) for target in targets]
    return edges


GRAPH: Dict[str, List[Edge]] = {module: edges_of(module) for module in MODULES}


def _runtime_graph() -> Dict[str, Set[str]]:
    return {
        module: {
            edge.target
            for edge in edges
            if edge.target in MODULES and edge.target != module and not edge.type_only
        }
        for module, edges in GRAPH.items()
    }


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Every strongly connected component of more than one module (the modules that import
    each other, directly or not), sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def circle_through(graph: Dict[str, Set[str]], component: List[str]) -> List[str]:
    """One path start -> ... -> start inside the component (breadth first: the shortest)."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node] & members):
            if target == start:
                return paths[node] + [start]
            if target not in paths:
                paths[target] = paths[node] + [target]
                queue.append(target)
    return component


def _where(module: str, target: str) -> str:
    lines = sorted({edge.line for edge in GRAPH[module] if edge.target == target and not edge.type_only})
    return f"{module} -> {target} (line {', '.join(map(str, lines))})"


def describe_cycle(component: List[str]) -> str:
    """One circle, then every import between the modules the circles tie together."""
    graph = _runtime_graph()
    inside = [_where(a, b) for a in component for b in sorted(graph[a] & set(component))]
    return " -> ".join(circle_through(graph, component)) + "\n    " + "\n    ".join(inside)


# Circles in code this branch does not own (issue 12 is split between helpers): the lead
# removes an entry when the branch that owns the code is merged.
# TODO(lead, at merge): cli/actions.py <-> launch/watchdog.py belongs to the engine/CLI branch.


def test_the_checker_finds_a_circle_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert circle_through(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_circles() -> None:
    cycles = find_cycles(_runtime_graph())
    assert not cycles, "import circles:\n  " + "\n  ".join(describe_cycle(cycle) for cycle in cycles)


def _prefix_of(module: str, prefixes: Tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


# What each part may import of probing (DESIGN.md, "The parts and who may import whom").
LEAVES = ("probing.protocol", "probing.schema", "probing.procfs", "probing.originals")
MAY_IMPORT = {
    "probing.agent": ("probing.agent", *LEAVES),
    # The protocol runs in the agent too: its clocks and JSON are the agent's own (originals.py).
    "probing.protocol": ("probing.protocol", "probing.originals"),
    "probing.schema": ("probing.schema",),
    "probing.procfs": (),
    "probing.originals": (),
    "probing.errors": (),
}


def _layering_violations() -> List[str]:
    found: Set[str] = set()
    for module, edges in GRAPH.items():
        for part, allowed in MAY_IMPORT.items():
            if not _prefix_of(module, (part,)):
                continue
            for edge in edges:
                if not edge.target.startswith("probing"):
                    continue
                # `from probing import __version__` (the package itself) is allowed to all.
                if edge.target != "probing" and not _prefix_of(edge.target, allowed):
                    found.add(f"{module}:{edge.line} imports {edge.target}")
    return sorted(found)


def test_agent_and_leaves_import_only_what_design_allows() -> None:
    """The agent runs inside the job: it imports the agent, the protocol, the schemas, procfs
    and originals, nothing of the CLI side. The leaves (protocol, schema, procfs, originals,
    errors) import nothing of probing beyond themselves (the protocol takes originals' clocks
    and JSON), so both sides can take them."""
    violations = _layering_violations()
    assert not violations, "\n".join(violations)


# TODO(lead, at merge): launch/watchdog.py imports cli/actions.py and cli/render.py; it belongs
# to the engine/CLI branch.


def _imports_of_the_cli() -> List[str]:
    return sorted(
        {
            f"{module}:{edge.line} imports {edge.target}"
            for module, edges in GRAPH.items()
            if not _prefix_of(module, ("probing.cli", "probing.__main__"))
            for edge in edges
            if _prefix_of(edge.target, ("probing.cli",))
        }
    )


def test_nothing_outside_the_cli_imports_the_cli() -> None:
    found = _imports_of_the_cli()
    assert not found, "\n".join(found)


# Below the engine (DESIGN.md): the parts it drives never reach back up into it, or into the
# launcher that drives it in turn.
BELOW_THE_ENGINE = (
    "probing.client", "probing.attach", "probing.outside", "probing.analysis", "probing.sql",
)  # fmt: skip


def test_the_parts_below_the_engine_never_import_it() -> None:
    found = sorted(
        f"{module}:{edge.line} imports {edge.target}"
        for module, edges in GRAPH.items()
        if _prefix_of(module, BELOW_THE_ENGINE)
        for edge in edges
        if _prefix_of(edge.target, ("probing.engine", "probing.launch"))
    )
    assert not found, "\n".join(found)


# analysis/ is pure functions over rows: it reads no /proc, runs nothing, waits for nothing
# (the engine samples; analysis judges what was sampled), so that a verdict is the same for the
# same rows, in a unit test as in a job.
IMPURE = ("probing.procfs", "time", "subprocess", "socket", "select", "threading", "signal")


def test_analysis_reads_and_waits_for_nothing() -> None:
    found = sorted(
        f"{module}:{edge.line} imports {edge.target}"
        for module, edges in GRAPH.items()
        if _prefix_of(module, ("probing.analysis",))
        for edge in edges
        if not edge.type_only and _prefix_of(edge.target, IMPURE)
    )
    assert not found, "\n".join(found)


FEATURES = ("probing.agent.evaluate", "probing.agent.repl", "probing.agent.memory", "probing.agent.pytorch")
CORE = ("probing.agent.tables", "probing.agent.handlers", "probing.agent.server")


def test_agent_features_never_import_the_core_that_serves_them() -> None:
    """agent/tables.py (how tables are filled) and handlers.py may import the features; a feature
    imports neither (the table definitions are in schema/tables.py, RequestError in
    agent/requests.py) and registers its stop hooks with lifecycle.py instead of being called."""
    found = sorted(
        {
            f"{module}:{edge.line} imports {edge.target}"
            for module, edges in GRAPH.items()
            if _prefix_of(module, FEATURES)
            for edge in edges
            if _prefix_of(edge.target, CORE)
        }
    )
    assert not found, "\n".join(found)


HEAVY = ("click", "duckdb", "psutil", "numpy", "torch")


def test_the_agent_imports_nothing_heavy_when_loaded() -> None:
    """torch features import torch inside functions, once the job has imported it."""
    found = [
        f"{module}:{edge.line} imports {edge.target}"
        for module, edges in GRAPH.items()
        if _prefix_of(module, ("probing.agent", *LEAVES, "probing.errors"))
        for edge in edges
        if edge.top_level and not edge.type_only and _prefix_of(edge.target, HEAVY)
    ]
    assert not found, "\n".join(found)


def _long_modules() -> Dict[str, int]:
    lengths = {module: len(path.read_text().splitlines()) for module, path in MODULES.items()}
    return {module: length for module, length in lengths.items() if length > MAX_LINES}


def test_modules_are_under_400_lines() -> None:
    long = _long_modules()
    assert not long, long


MAX_FUNCTION_LINES = 60


def _long_functions() -> Dict[str, int]:
    """Every function (methods and nested ones included) longer than MAX_FUNCTION_LINES, counted
    as ast counts it: from the `def` line to the last line of its body."""
    long = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{module}.{node.name} (line {node.lineno})"] = length
    return long


def test_functions_are_at_most_60_lines() -> None:
    long = _long_functions()
    assert not long, "\n".join(f"{name}: {length} lines" for name, length in sorted(long.items()))


def test_native_sources_are_under_400_lines() -> None:
    native = Path(__file__).resolve().parents[2] / "native"
    lengths = {path.name: len(path.read_text().splitlines()) for path in native.glob("*.[ch]")}
    assert lengths, f"no C sources in {native}"
    assert not {name: n for name, n in lengths.items() if n > MAX_LINES}, lengths
