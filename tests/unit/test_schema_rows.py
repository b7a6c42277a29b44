"""The typed rows (schema/rows.py) are what schema/rowgen.py writes from the tables' columns, and
every python.backtrace row, on either side, is built by one of its constructors: no module spells
the row's columns itself, as dict keys or as a tuple in column order."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Iterator, List, Set

from probing.schema import rowgen, rows
from probing.schema.tables import BACKTRACE

ROWS = Path(rows.__file__).resolve()
PACKAGE = ROWS.parents[1]
COLUMNS = BACKTRACE.column_names()
# python.backtrace's frame_type values: a tuple holding one, as long as the table is wide, is a
# row in column order.
FRAME_TYPES = {"Python", "Native"}

# Where python.backtrace rows are built: as dicts on the CLI side, as values in column order for
# the agent's column builders.
DICT_BUILDERS = ("outside/pyspy.py", "outside/core.py", "engine/fatal_text.py", "engine/records/record.py")
VALUES_BUILDERS = ("agent/stacks.py", "agent/records/writer.py")


def _type_checking_classes(tree: ast.Module) -> List[ast.ClassDef]:
    blocks = [
        node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    return [node for block in blocks for node in block.body if isinstance(node, ast.ClassDef)]


def test_rows_module_is_generated_from_the_schema() -> None:
    assert ROWS.read_text() == rowgen.rows_module(), (
        "probing/schema/rows.py is stale: python -m probing.schema.rowgen > probing/schema/rows.py"
    )


def test_each_typed_table_has_a_typed_dict_of_its_columns_and_types() -> None:
    classes = {node.name: node for node in _type_checking_classes(ast.parse(ROWS.read_text()))}
    for table in rowgen.TYPED_TABLES:
        fields = [
            node for node in classes[rowgen.row_type_name(table)].body if isinstance(node, ast.AnnAssign)
        ]
        assert [ast.unparse(field.target) for field in fields] == table.column_names(), table.name
        assert [ast.unparse(field.annotation) for field in fields] == [
            f"Optional[{rowgen._PYTHON_TYPES[column.type]}]" for column in table.columns
        ], table.name


def test_rows_module_imports_nothing_when_the_agent_loads_it() -> None:
    """The agent imports it inside the job, which must see no new module (typing among them):
    the TypedDicts and their imports are under `if TYPE_CHECKING:`, False at run time."""
    tree = ast.parse(ROWS.read_text())
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(node) for node in imports] == ["from __future__ import annotations"]
    assert "TYPE_CHECKING = False" in [ast.unparse(node) for node in tree.body]


def test_each_constructor_takes_every_column_by_name_and_gives_them_in_order() -> None:
    for table in rowgen.BUILT_TABLES:
        names = table.column_names()
        values = {name: f"<{name}>" for name in names}
        build = getattr(rows, rowgen.function_name(table))
        in_order = getattr(rows, rowgen.values_function_name(table))
        values_of = getattr(rows, rowgen.values_of_function_name(table))
        assert list(inspect.signature(build).parameters) == names
        assert list(inspect.signature(in_order).parameters) == names
        assert build(**values) == values and list(build(**values)) == names
        assert in_order(**values) == tuple(values[name] for name in names)
        assert values_of(build(**values)) == in_order(**values)


def _literal_keys(node: ast.AST) -> Set[str]:
    """The keys a dict display, or a dict(...) call, spells out."""
    if isinstance(node, ast.Dict):
        return {
            key.value for key in node.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)
        }
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return {keyword.arg for keyword in node.keywords if keyword.arg is not None}
    return set()


def rows_built_by_hand(source: str) -> Iterator[int]:
    """Lines where `source` builds a python.backtrace row itself: a dict naming at least half
    of its columns, or a tuple as wide as the table holding a frame_type ('Python')."""
    for node in ast.walk(ast.parse(source)):
        if len(_literal_keys(node) & set(COLUMNS)) * 2 >= len(COLUMNS):
            yield node.lineno
        elif isinstance(node, ast.Tuple) and len(node.elts) == len(COLUMNS):
            if any(isinstance(value, ast.Constant) and value.value in FRAME_TYPES for value in node.elts):
                yield node.lineno


def test_the_scan_finds_a_row_built_by_hand() -> None:
    by_keys = "row = {" + ", ".join(f'"{name}": None' for name in COLUMNS[:6]) + "}"
    by_keywords = "row = dict(" + ", ".join(f"{name}=None" for name in COLUMNS[:6]) + ")"
    values = ["None"] * len(COLUMNS)
    values[COLUMNS.index("frame_type")] = '"Python"'
    in_order = "builder.append((" + ", ".join(values) + "))"
    for source in (by_keys, by_keywords, in_order):
        assert list(rows_built_by_hand(source)) == [1], source
    assert (
        list(rows_built_by_hand('thread = {"name": n, "thread_id": t, "native_id": i, "is_main": m}')) == []
    )


def test_no_module_builds_a_backtrace_row_but_its_constructors() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != ROWS
        for line in rows_built_by_hand(path.read_text())
    ]
    assert found == [], f"{BACKTRACE.name} rows built by hand (use schema/rows.py's constructors): {found}"


def test_the_builders_of_backtrace_rows_use_the_constructors() -> None:
    """The agent's rows, py-spy's, pystack's from a core, faulthandler's from a .fatal file, and a
    record's as the renderers read them."""
    for module in DICT_BUILDERS:
        assert "backtrace_row(" in (PACKAGE / module).read_text(), module
    for module in VALUES_BUILDERS:
        assert "backtrace_values(" in (PACKAGE / module).read_text(), module
