"""Stacks read like Python tracebacks: one process, or a process tree with its notes."""

from __future__ import annotations

import os
import sys

from ...engine.sources import SourceLines
from ...protocol import json_loads
from . import inert, note

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any, Dict, List, Optional, Tuple

    from ...engine.backtrace import Stacks, TreeStacks


def write_backtrace_text(
    rows: List[Dict[str, Any]],
    info: Dict[str, Any],
    out: IO[str],
    host_pid: Optional[int] = None,
    outside: Optional[Dict[Any, Dict[str, Any]]] = None,
    sources: Optional[SourceLines] = None,
) -> None:
    """Threads grouped, main thread first, each read like a Python traceback and headed by
    what it is doing. `outside`: py-spy's view of each thread (by native id), if it read them."""
    from ...analysis.states import thread_state

    pid = info.get("pid")
    shown = f"{host_pid} (PID {pid} in its namespace)" if host_pid and host_pid != pid else pid
    argv = " ".join(str(arg) for arg in info.get("argv") or [])
    out.write(f"Process {inert(shown)} (Python {inert(info.get('python_version'))}): {inert(argv)}\n")
    if sources is None:
        sources = SourceLines(host_pid or (pid if isinstance(pid, int) else None))
    threads: Dict[Tuple[Any, Any], List[Dict[str, Any]]] = {}
    for row in rows:
        threads.setdefault((row["pid"], row["thread_id"]), []).append(row)
    for frames in threads.values():
        frames.sort(key=lambda row: row["depth"])
        first = frames[0]
        native = first["native_id"] if first["native_id"] is not None else first["thread_id"]
        state = thread_state(
            frames, lambda frame: sources.line(frame["file"], frame["lineno"]), (outside or {}).get(native)
        )
        main = ", main thread" if first["is_main"] else ""
        out.write(
            f'\nThread {inert(native)} "{inert(first["thread_name"])}"{main}: {inert(state)} '
            "(most recent call last):\n"
        )
        for frame in reversed(frames):
            lineno = frame["lineno"]
            if frame["frame_type"] == "Native":
                out.write(
                    f"  [native] {inert(frame['func'])} in {inert(os.path.basename(str(frame['file'])))}\n"
                )
                continue
            shown_line = lineno if lineno is not None else "?"
            out.write(
                f'  File "{inert(frame["file"])}", line {inert(shown_line)}, in {inert(frame["func"])}\n'
            )
            code = sources.line(frame["file"], lineno)
            if code:
                out.write(f"    {inert(code)}\n")
            if frame.get("locals"):
                for name, value in _locals(frame["locals"]):
                    out.write(f"      {inert(name)} = {inert(value)}\n")
    if not threads:
        out.write("\n(no Python threads)\n")


def _locals(text: Any) -> List[Tuple[Any, Any]]:
    """The (name, repr) pairs of a frame's `locals` column; what does not parse is shown as is."""
    try:
        values = json_loads(str(text))
    except ValueError:
        return [("locals", text)]
    return list(values.items()) if isinstance(values, dict) else [("locals", text)]


def write_tree(tree: TreeStacks, format: str, sources: Optional[SourceLines] = None) -> None:
    """`probing PID backtrace [--children]`: what could not be read and why the answer came
    from outside (stderr), then every process's stacks (stdout). `sources`: where the source
    lines come from (a record's: read as its owner), else each process's own files."""
    for pid, command, error in tree.failed:
        note(f"PID {pid} ({command}): {error.message}")
    for stacks in tree.processes:
        for message in stacks.notes:
            note(f"PID {stacks.info.get('pid')}: {message}")
    sys.stderr.flush()
    out = sys.stdout
    if format == "text":
        for index, stacks in enumerate(tree.processes):
            if index:
                out.write("\n")
            write_backtrace_text(
                stacks.rows, stacks.info, out, stacks.pid, stacks.info.get("outside"), sources
            )
        return
    from ...schema.tables import BACKTRACE
    from .rows import write_rows

    names = BACKTRACE.column_names()
    types = [column.type for column in BACKTRACE.columns]
    every = [tuple(row[name] for name in names) for stacks in tree.processes for row in stacks.rows]
    write_rows(names, types, every, format, out)


def write_stacks_to_stderr(stacks: Stacks) -> None:
    """One process's stacks on stderr (the run watchdog's dump of a hung job)."""
    sys.stderr.write("\n")
    write_backtrace_text(stacks.rows, stacks.info, sys.stderr, stacks.pid, stacks.info.get("outside"))
