"""The typed row constructors (schema/rows.py) are what schema/rowgen.py writes from the tables'
columns, and every dict row of python.backtrace built on this side comes out of one."""

from __future__ import annotations

import inspect
from pathlib import Path

from probing.schema import rowgen, rows
from probing.schema.tables import BACKTRACE

ROWS = Path(rows.__file__)


def test_rows_module_is_generated_from_the_schema() -> None:
    assert ROWS.read_text() == rowgen.rows_module(), (
        "probing/schema/rows.py is stale: python -m probing.schema.rowgen > probing/schema/rows.py"
    )


def test_each_constructor_takes_every_column_by_name_and_gives_them_in_order() -> None:
    for table in rowgen.BUILT_AS_DICTS:
        build = getattr(rows, rowgen.function_name(table))
        names = table.column_names()
        assert list(inspect.signature(build).parameters) == names
        assert list(build(**{name: None for name in names})) == names


def test_the_builders_of_backtrace_rows_use_it() -> None:
    """py-spy's rows, pystack's from a core, faulthandler's from a .fatal file: no literal row."""
    package = Path(rows.__file__).resolve().parents[1]
    for module in ("outside/pyspy.py", "outside/core.py", "engine/fatal_text.py"):
        source = (package / module).read_text()
        assert "backtrace_row(" in source, module
        assert '"is_main":' not in source, f"{module} builds a {BACKTRACE.name} row by hand"
