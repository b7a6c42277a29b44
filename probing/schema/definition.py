"""What a table is: its name, its documentation, and its columns with their types and docs.
Standard library only and Python 3.8 syntax: the agent imports it inside the job."""

from __future__ import annotations

from collections import namedtuple

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing (and the re it imports) costs `probing PID backtrace` start-up
    from typing import Any, Dict, List, Tuple


class Column(namedtuple("Column", "name type doc")):
    """A column: its name, its DuckDB type and what it holds."""

    __slots__ = ()
    name: str
    type: str
    doc: str


class Table(namedtuple("Table", "name doc columns")):
    """A table: its name, what it holds, and its columns in order."""

    __slots__ = ()
    name: str
    doc: str
    columns: List[Column]

    def column_types(self) -> List[Tuple[str, str]]:
        return [(column.name, column.type) for column in self.columns]

    def column_names(self) -> List[str]:
        return [column.name for column in self.columns]

    def describe(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "doc": self.doc,
            "columns": [{"name": c.name, "type": c.type, "doc": c.doc} for c in self.columns],
        }
