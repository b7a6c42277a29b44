"""What a table is: its name, its documentation, and its columns with their types and docs.
Standard library only and Python 3.8 syntax: the agent imports it inside the job."""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Tuple


class Column(NamedTuple):
    name: str
    type: str
    doc: str


class Table(NamedTuple):
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
