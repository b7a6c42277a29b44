"""Rows as people read them (an aligned table) or as scripts do (csv, json, jsonl)."""

from __future__ import annotations

import datetime
import json
import sys
from typing import IO, Any, Iterable, List, Optional, Sequence

from . import inert, writable
from .json_writer import dumps, write_json, write_json_lines

Rows = Sequence[Sequence[Any]]


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (list, dict)):
        return dumps(value)
    return str(value)


def write_rows(
    columns: Sequence[str],
    types: Sequence[str],
    rows: Rows,
    fmt: str,
    out: Optional[IO[str]] = None,
    fit_terminal: bool = False,
) -> None:
    """`fit_terminal`: on a terminal, the table's last column is cut to the terminal's width
    (to a pipe or a file, and in the other formats, every value stays whole for scripts)."""
    out = out or sys.stdout
    if fmt == "json" or fmt == "jsonl":
        decode = [column_type.upper() == "JSON" for column_type in types]
        objects = (
            {
                name: (_json_value(value) if is_json and isinstance(value, str) else value)
                for name, value, is_json in zip(columns, row, decode)
            }
            for row in rows
        )
        if fmt == "jsonl":
            write_json_lines(objects, out)
        else:
            write_json(list(objects), out)
        return
    if fmt == "csv":
        import csv  # most commands load rows.py; csv is for --format csv alone

        # Exact values, but for lone surrogates, which have no bytes to write (render.writable).
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([writable(name) for name in columns])
        for row in rows:
            writer.writerow(["" if value is None else writable(_cell(value)) for value in row])
        return
    write_table(columns, types, rows, out, terminal_width(out) if fit_terminal else None)


def terminal_width(out: IO[str]) -> Optional[int]:
    """The columns of the terminal `out` writes to; None when it is no terminal."""
    import shutil  # not at the top: `backtrace --format table` reaches this module (cli/fast.py)

    try:
        terminal = out.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return shutil.get_terminal_size().columns if terminal else None


# JSON nested deeper than this is written as its text: the JSON writer recurses once per level
# (twice, with its comprehensions), and the agent's JSON (locals, tags) is one or two deep.
MAX_JSON_DEPTH = 100


def _json_value(text: str) -> Any:
    """A JSON column's value as the JSON it holds; its text when it holds none, or nests deeper
    than MAX_JSON_DEPTH (the job wrote it: a record's, or a hostile agent's, `locals` may be
    any text), which JSON then quotes."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if _depth_within(value, MAX_JSON_DEPTH) else text


def _depth_within(value: Any, limit: int) -> bool:
    """Whether lists and objects nest at most `limit` deep in `value` (without recursing)."""
    level: List[Any] = [value]
    for _ in range(limit + 1):
        level = [
            item
            for each in level
            if isinstance(each, (list, dict))
            for item in (each.values() if isinstance(each, dict) else each)
        ]
        if not level:
            return True
    return False


_NUMERIC = ("INT", "DOUBLE", "FLOAT", "DECIMAL", "REAL", "NUMERIC")


# What `fit` leaves of the last column at least, however narrow the terminal.
MIN_LAST_COLUMN = 20


def write_table(
    columns: Sequence[str], types: Sequence[str], rows: Rows, out: IO[str], fit: Optional[int] = None
) -> None:
    """An aligned table; `fit`: the width its lines must keep within, by cutting values of the last
    column (a command line) with `...`."""
    cells = [[inert(_cell(value)) for value in row] for row in rows]
    columns = [inert(name) for name in columns]
    widths = [len(name) for name in columns]
    for row in cells:
        widths = [max(width, len(text)) for width, text in zip(widths, row)]
    if fit is not None and widths and sum(widths) + 2 * (len(widths) - 1) > fit:
        room = max(MIN_LAST_COLUMN, len(columns[-1]), fit - sum(widths[:-1]) - 2 * (len(widths) - 1))
        widths[-1] = room
        for row in cells:
            if len(row[-1]) > room:
                row[-1] = row[-1][: room - 3] + "..."
    right = [
        any(kind in column_type.upper() for kind in _NUMERIC) and "[]" not in column_type
        for column_type in types
    ]

    def line(values: Iterable[str]) -> str:
        parts = [
            text.rjust(width) if align else text.ljust(width)
            for text, width, align in zip(values, widths, right)
        ]
        return "  ".join(parts).rstrip() + "\n"

    out.write(line(columns))
    out.write(line("-" * width for width in widths))
    for row in cells:
        out.write(line(row))
