"""`python -m probing.schema.rowgen > probing/schema/rows.py`: typed rows of the tables this side
reads by column name, written from the tables' own columns, so that mypy checks every `row["x"]`
names a column of the table, with its type.

For each table in TYPED_TABLES: a TypedDict (`BacktraceRow` for python.backtrace). For each table
in BUILT_TABLES, whose rows are built in more than one place (python.backtrace: by the agent, by
py-spy from outside, by pystack from a core, from a fatal-signal file), also a keyword-only
constructor of the row as a dict (`backtrace_row`) and of its values in column order as the
agent's column builders take them (`backtrace_values`), and a dict row's values in column order
(`backtrace_values_of`, to load it into DuckDB): the column order lives here only.
tests/unit/test_schema_rows.py checks rows.py is what this writes.

rows.py is imported inside the job by the agent: the TypedDicts exist for the checker only (under
`if TYPE_CHECKING:`, which is False at run time), so importing it loads no `typing`."""

from __future__ import annotations

from typing import List

from .definition import Table
from .tables import ASYNCIO_TASKS, BACKTRACE, COLLECTIVES, PROCESS_GROUPS, PYTHON_GC, THREADS

# The tables whose rows the CLI side reads by column name.
TYPED_TABLES = (BACKTRACE, THREADS, PYTHON_GC, COLLECTIVES, PROCESS_GROUPS, ASYNCIO_TASKS)
# Those whose rows are built on both sides, in more than one place: built by the constructors only.
BUILT_TABLES = (BACKTRACE,)

_PYTHON_TYPES = {
    "BIGINT": "int",
    "INTEGER": "int",
    "VARCHAR": "str",
    "DOUBLE": "float",
    "BOOLEAN": "bool",
    "JSON": "str",  # the JSON text
    "TIMESTAMP": "float",  # seconds since the epoch
    "VARCHAR[]": "List[str]",
    "BIGINT[]": "List[int]",
}


def _short_name(table: Table) -> str:
    return table.name.split(".", 1)[1]


def row_type_name(table: Table) -> str:
    """python.backtrace -> BacktraceRow, python.process_groups -> ProcessGroupsRow."""
    return "".join(part.capitalize() for part in _short_name(table).split("_")) + "Row"


def values_type_name(table: Table) -> str:
    """python.backtrace -> BacktraceValues."""
    return row_type_name(table)[: -len("Row")] + "Values"


def function_name(table: Table) -> str:
    """python.backtrace -> backtrace_row."""
    return _short_name(table) + "_row"


def values_function_name(table: Table) -> str:
    """python.backtrace -> backtrace_values."""
    return _short_name(table) + "_values"


def values_of_function_name(table: Table) -> str:
    """python.backtrace -> backtrace_values_of."""
    return _short_name(table) + "_values_of"


def _column_type(column_type: str) -> str:
    return f"Optional[{_PYTHON_TYPES[column_type]}]"


def _typed_dict(table: Table) -> List[str]:
    lines = ["", f"    class {row_type_name(table)}(TypedDict):", f'        """A row of {table.name}."""', ""]
    return lines + [f"        {column.name}: {_column_type(column.type)}" for column in table.columns]


def _values_type(table: Table) -> List[str]:
    lines = ["", f"    # {table.name}'s columns in table order.", f"    {values_type_name(table)} = Tuple["]
    return lines + [f"        {_column_type(column.type)}," for column in table.columns] + ["    ]"]


def _parameters(table: Table) -> List[str]:
    return ["    *,"] + [f"    {column.name}: {_column_type(column.type)}," for column in table.columns]


def _constructors(table: Table) -> List[str]:
    names = [column.name for column in table.columns]
    lines = ["", "", f"def {function_name(table)}("]
    lines += _parameters(table)
    lines += [
        f") -> {row_type_name(table)}:",
        f'    """A row of {table.name}: every column by name, typed as the table has it."""',
        "    return {",
    ]
    lines += [f'        "{name}": {name},' for name in names]
    lines += ["    }", "", "", f"def {values_function_name(table)}("]
    lines += _parameters(table)
    lines += [
        f") -> {values_type_name(table)}:",
        f'    """A row of {table.name} as the agent\'s column builders take it: values in column order."""',
        "    return (",
    ]
    lines += [f"        {name}," for name in names]
    lines += [
        "    )",
        "",
        "",
        f"def {values_of_function_name(table)}(row: {row_type_name(table)}) -> {values_type_name(table)}:",
    ]
    lines += [
        f'    """A row of {table.name} as a dict, as its values in column order (to load it into DuckDB)."""'
    ]
    lines += ["    return (", *(f'        row["{name}"],' for name in names), "    )"]
    return lines


def _typing_names() -> str:
    types = {_PYTHON_TYPES[column.type] for table in TYPED_TABLES for column in table.columns}
    names = ["Optional", "TypedDict"] + (["Tuple"] if BUILT_TABLES else [])
    names += ["List"] if any(name.startswith("List[") for name in types) else []
    return ", ".join(sorted(names))


def rows_module() -> str:
    makers = (function_name, values_function_name, values_of_function_name)
    functions = [name(table) for table in BUILT_TABLES for name in makers]
    lines = [
        '"""Typed rows of the tables read by column name, and constructors of those built in more',
        "than one place. Generated by `python -m probing.schema.rowgen > probing/schema/rows.py` from",
        'schema/tables.py: do not edit by hand."""',
        "",
        "from __future__ import annotations",
        "",
        "TYPE_CHECKING = False",
        "if TYPE_CHECKING:  # the agent imports this module inside the job: no typing there",
        f"    from typing import {_typing_names()}",
    ]
    for table in TYPED_TABLES:
        lines += _typed_dict(table)
    for table in BUILT_TABLES:
        lines += _values_type(table)
    lines += ["", "__all__ = [" + ", ".join(f'"{name}"' for name in functions) + "]"]
    for table in BUILT_TABLES:
        lines += _constructors(table)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(rows_module(), end="")
