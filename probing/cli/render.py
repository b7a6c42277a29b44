"""Everything `probing` prints is formatted here: tracebacks, tables, eval output, errors."""

from __future__ import annotations

import os
import sys

from ..errors import EvalTimedOut, ProbingError, RemoteError
from ..protocol import json_loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any, Dict, Iterable, List, Optional, Sequence, Tuple

    Rows = Sequence[Sequence[Any]]


# --- what the job controls, made inert ----------------------------------------------------
#
# Thread, function and file names, reprs of locals, table values, eval output, agent error
# messages: the job writes them all, and a job may be hostile (root inspects other users'
# jobs). On a terminal, ESC starts sequences that retitle the window, clear the screen or
# rewrite what is shown; CR and a newline can forge a line ("MainThread ..."). Every such
# string goes through `inert` on its way to people: control characters become visible text
# (\x1b, \r, \n), as Python's repr writes them. JSON and CSV keep the exact values (their
# writers escape them correctly).

_ESCAPED = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_ESCAPED.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
# Line and paragraph separators, and bidirectional overrides that reorder what is shown.
_ESCAPED.update(
    {code: f"\\u{code:04x}" for code in (0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))}
)
_ESCAPED_KEEPING_LINES = {code: text for code, text in _ESCAPED.items() if code not in (0x0A, 0x09)}


def inert(value: Any) -> str:
    """`value` as text that cannot act on a terminal: every control character made visible."""
    return str(value).translate(_ESCAPED)


def inert_lines(text: str, out: IO[str]) -> str:
    """Multi-line output of the job (eval's prints, a remote traceback) for `out`: on a
    terminal, control characters other than newline and tab are made visible; to a file or
    a pipe, the exact text goes through."""
    try:
        terminal = out.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return text.translate(_ESCAPED_KEEPING_LINES) if terminal else text


class _InertStream:
    """A stream whose every write is made inert except for newlines and tabs: for reports
    (memory) that interleave many job-controlled names with their own layout."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out

    def write(self, text: str) -> int:
        return self._out.write(str(text).translate(_ESCAPED_KEEPING_LINES))

    def flush(self) -> None:
        self._out.flush()


def inert_stream(out: IO[str]) -> IO[str]:
    stream: Any = _InertStream(out)
    return stream  # type: ignore[no-any-return]


class SourceLines:
    """Lines of the job's source files, read by the CLI so the target does no file I/O."""

    def __init__(self, pid: Optional[int]) -> None:
        self.pid = pid
        self._files: Dict[str, List[str]] = {}

    def line(self, filename: str, lineno: Optional[int]) -> str:
        if not lineno or filename.startswith("<"):
            return ""
        lines = self._files.get(filename)
        if lines is None:
            lines = self._files[filename] = self._read(filename)
        return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""

    def _read(self, filename: str) -> List[str]:
        # A job in a container sees its files under its own root.
        for path in (filename, f"/proc/{self.pid}/root{filename}" if self.pid else None):
            if path is None:
                continue
            try:
                with open(path, "rb") as handle:
                    return handle.read().decode("utf-8", "replace").splitlines()
            except OSError:
                continue
        return []


def write_backtrace_text(
    rows: List[Dict[str, Any]],
    info: Dict[str, Any],
    out: IO[str],
    host_pid: Optional[int] = None,
    outside: Optional[Dict[Any, Dict[str, Any]]] = None,
) -> None:
    """Threads grouped, main thread first, each read like a Python traceback and headed by
    what it is doing. `outside`: py-spy's view of each thread (by native id), if it read them."""
    from ..analysis.states import thread_state

    pid = info.get("pid")
    shown = f"{host_pid} (PID {pid} in its namespace)" if host_pid and host_pid != pid else pid
    argv = " ".join(str(arg) for arg in info.get("argv") or [])
    out.write(f"Process {inert(shown)} (Python {inert(info.get('python_version'))}): {inert(argv)}\n")
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


# --- rows: table, csv, json, jsonl ----------------------------------------------------------


def _json_value(value: Any) -> Any:
    import datetime
    import decimal

    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return str(value)


def _finite_or_null(value: Any) -> Any:
    # JSON has no NaN or Infinity: json.dumps would write tokens that jq and most parsers reject.
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def _cell(value: Any) -> str:
    import datetime
    import json

    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=_json_value)
    return str(value)


def write_rows(
    columns: Sequence[str],
    types: Sequence[str],
    rows: Rows,
    fmt: str,
    out: IO[str],
) -> None:
    if fmt == "json" or fmt == "jsonl":
        import json

        decode = [column_type.upper() == "JSON" for column_type in types]
        objects = (
            {
                name: (json.loads(value) if is_json and isinstance(value, str) else _finite_or_null(value))
                for name, value, is_json in zip(columns, row, decode)
            }
            for row in rows
        )
        if fmt == "jsonl":
            for item in objects:
                out.write(json.dumps(item, default=_json_value) + "\n")
        else:
            json.dump(list(objects), out, default=_json_value, indent=2)
            out.write("\n")
        return
    if fmt == "csv":
        import csv

        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if value is None else _cell(value) for value in row])
        return
    _write_table(columns, types, rows, out)


_NUMERIC = ("INT", "DOUBLE", "FLOAT", "DECIMAL", "REAL", "NUMERIC")


def _write_table(columns: Sequence[str], types: Sequence[str], rows: Rows, out: IO[str]) -> None:
    cells = [[inert(_cell(value)) for value in row] for row in rows]
    columns = [inert(name) for name in columns]
    widths = [len(name) for name in columns]
    for row in cells:
        widths = [max(width, len(text)) for width, text in zip(widths, row)]
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


# --- other commands -------------------------------------------------------------------------


def write_tables(tables: List[Dict[str, Any]], out: IO[str]) -> None:
    for index, table in enumerate(tables):
        if index:
            out.write("\n")
        out.write(f"{inert(table['name'])}: {inert(table.get('doc', ''))}\n")
        name_width = max(len(inert(column["name"])) for column in table["columns"])
        type_width = max(len(inert(column["type"])) for column in table["columns"])
        for column in table["columns"]:
            name, kind = inert(column["name"]).ljust(name_width), inert(column["type"]).ljust(type_width)
            out.write(f"  {name}  {kind}  {inert(column.get('doc', ''))}\n")


def write_attach(pid: int, attached: Any, format: str, out: IO[str]) -> None:
    report = attached.report
    if format == "json":
        import json

        fields = report._asdict() if report is not None else {"method": None}
        out.write(
            json.dumps({"pid": pid, "socket": attached.socket, "waited_ms": attached.waited_ms, **fields})
            + "\n"
        )
        return
    if report is None and attached.waited_ms:
        out.write(f"PID {pid}: the agent of an earlier attach came up at {attached.socket}\n")
        return
    if report is None:
        out.write(f"PID {pid} already has an agent: {attached.socket}\n")
        return
    if isinstance(report.thread, int):
        held = f"thread {report.thread} ({report.where}) was stopped for {report.stopped_ms:.2f} ms"
    else:
        by = "gdb" if report.method == "gdb" else f"{report.method}'s gdb"
        held = f"every thread was stopped by {by} for up to {report.stopped_ms:.0f} ms"
    out.write(
        f"PID {pid}: attached with {report.method}; {held}; the agent answered "
        f"{attached.waited_ms:.0f} ms later at {attached.socket}\n"
    )


def write_hang(report: Any, out: IO[str]) -> None:
    main = next((thread for thread in report.threads if thread.is_main), None)
    if report.hung:
        verdict = "hung: its main thread did not move"
    elif main is not None and not main.moved:
        verdict = "busy: its main thread stayed in one place but used the CPU"
    else:
        verdict = "progressing: its main thread moved (its stack changed, or it kept waking up)"
    out.write(f"PID {report.pid} is {verdict} in {report.duration_s:.1f} s ({report.samples} samples)\n\n")
    columns = ["thread", "moved", "cpu", "state", "where"]
    rows = [
        (
            f"{thread.name}{' (main)' if thread.is_main else ''}",
            "yes" if thread.moved else "no",
            "?" if thread.cpu_percent is None else f"{thread.cpu_percent:.0f}%",
            thread.state,
            thread.where,
        )
        for thread in report.threads
    ]
    _write_table(columns, ["VARCHAR"] * len(columns), rows, out)
    worker = report.worker
    if worker is not None:
        index = f", index {worker['index']}" if worker.get("index") is not None else ""
        where = f"{worker['where']}{index}"
        out.write(f"\nThe DataLoader is waiting for worker PID {worker['pid']}, stuck in {inert(where)}:\n\n")


def write_eval_result(result: Dict[str, Any], out: IO[str], err: IO[str]) -> None:
    if result.get("stdout"):
        out.write(inert_lines(result["stdout"], out))
    if result.get("stderr"):
        err.write(inert_lines(result["stderr"], err))
    if result.get("value") is not None:
        out.write(inert_lines(str(result["value"]), out) + "\n")


# --- repl -------------------------------------------------------------------------------------


def write_repl_banner(info: Dict[str, Any], err: IO[str]) -> None:
    executable = os.path.basename(str(info.get("executable") or "python"))
    command = inert(" ".join([executable, *(str(arg) for arg in info.get("argv") or [])]))
    err.write(
        f"Python {inert(info.get('python_version'))} in PID {inert(info.get('pid'))} ({command}): "
        "names from __main__ "
        "are visible, names you assign stay in this session. Ctrl-C interrupts, Ctrl-D leaves.\n"
    )
    err.flush()


def write_repl_reply(reply: Dict[str, Any], out: IO[str], err: IO[str]) -> None:
    """What a statement printed since the last reply (flushed: it streams), then its traceback."""
    if reply.get("stdout"):
        out.write(inert_lines(str(reply["stdout"]), out))
        out.flush()
    for text in (reply.get("stderr"), reply.get("traceback")):
        if text:
            err.write(inert_lines(str(text), err))
            err.flush()


def write_repl_keyboard_interrupt(err: IO[str]) -> None:
    err.write("\nKeyboardInterrupt\n")
    err.flush()


def repl_note(message: str) -> None:
    sys.stderr.write(f"probing: {inert(message)}\n")
    sys.stderr.flush()


def report_error(error: ProbingError, err: Optional[IO[str]] = None) -> int:
    """The single place an expected failure becomes a message; returns the exit code."""
    err = err or sys.stderr
    if isinstance(error, RemoteError):
        # What the code printed before it raised, then its traceback, as Python would show it.
        if error.stdout:
            sys.stdout.write(inert_lines(error.stdout, sys.stdout))
            sys.stdout.flush()
        if error.stderr:
            err.write(inert_lines(error.stderr, err))
        err.write(inert_lines(error.traceback or error.message + "\n", err))
        return int(error.exit_code)
    if isinstance(error, EvalTimedOut):
        if error.stdout:
            sys.stdout.write(inert_lines(error.stdout, sys.stdout))
            sys.stdout.flush()
        if error.stderr:
            err.write(inert_lines(error.stderr, err))
    # Messages quote what the agent said and names the job chose (threads, frames, paths).
    err.write(f"probing: error: {inert(error.message)}\n")
    if error.hint:
        err.write(f"  hint: {_indented(error.hint)}\n")
    return int(error.exit_code)


def _indented(hint: str) -> str:
    """A hint of several lines (DuckDB's, with the SQL and a caret under the error), inert but
    for its newlines, each further line indented: no line of it can pass for one of ours."""
    first, *rest = hint.translate(_ESCAPED_KEEPING_LINES).split("\n")
    return "\n".join([first, *(line if line[:1].isspace() else "        " + line for line in rest)])


def log_to_stderr(message: str) -> None:
    sys.stderr.write(f"probing: {inert(message)}\n")


def note(message: str) -> None:
    """A note about the answer (why it came from outside, what the agent cut short)."""
    sys.stderr.write(f"probing: {inert(message)}\n")


def stdout_is_closed() -> None:
    """After a BrokenPipeError (`probing ... | head`): silence the flush at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def write_switch(feature: str, action: str, pid: Any, result: Dict[str, Any], out: IO[str]) -> None:
    """What `trace` and `nan` did, and where things stand now."""
    status = result["status"]
    added = result["hooks_after"] - result["hooks_before"]
    models = ", ".join(status["models"]) or "none found yet"
    optimizers = ", ".join(status["optimizers"]) or "none seen yet"
    if status["trace"]:
        if status["every_auto"]:
            every = (
                f"{'every step' if status['every'] == 1 else 'one step in ' + str(status['every'])} "
                "(chosen to keep tracing under 1% of the step time; "
                f"{status['call_cost_us']} us per traced call here)"
            )
        else:
            every = "every step" if status["every"] == 1 else f"one step in {status['every']}"
        narrowed = []
        if status["modules"]:
            narrowed.append("modules " + " ".join(status["modules"]))
        if status["depth"] is not None:
            narrowed.append(f"depth <= {status['depth']}")
        tracing = f"on, {every}, forward{' and backward' if status['backward'] else ' only'}"
        tracing += f" ({'; '.join(narrowed)})" if narrowed else ""
    else:
        tracing = "off"
    nan = "off"
    if status["nan"]:
        nan = "on" + (", --stop: raise at the first NaN/Inf" if status["stop_on_nan"] else "")
    if status["stopped_at_step"] is not None:
        nan += f" (stopped the job at step {status['stopped_at_step']})"
    if action == "on":
        out.write(f"PID {pid}: {feature} on; {_plural(added, 'hook')} added\n")
    elif action == "off":
        removed = -added
        kept = result["hooks_after"]
        out.write(f"PID {pid}: {feature} off; {_plural(removed, 'hook')} removed")
        out.write(
            f", {_plural(kept, 'hook')} kept for {'nan' if feature == 'trace' else 'trace'}\n"
            if kept
            else "\n"
        )
    else:
        out.write(f"PID {pid}:\n")
    out.write(f"  tracing:    {tracing}\n")
    out.write(f"  nan checks: {nan}\n")
    out.write(
        f"  models:     {models} ({_plural(status['hooked_modules'], 'module')} hooked, "
        f"{_plural(status['hooks'], 'hook')} in all)\n"
    )
    out.write(f"  optimizers: {optimizers}\n")
    dropped = f" ({status['dropped_rows']} older rows dropped)" if status["dropped_rows"] else ""
    out.write(
        f"  step {status['step']}; python.torch_trace holds {status['rows']} of {status['capacity']} rows"
        f"{dropped}; python.nan_events {status['nan_events']}\n"
    )
    if status["error"]:
        out.write(f"  stopped after an error in a hook (nothing was raised in the job): {status['error']}\n")
