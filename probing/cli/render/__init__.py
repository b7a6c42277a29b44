"""Every byte `probing` prints goes through this package: tracebacks, tables, JSON, eval
output, reports, notes and errors. Command modules (cli/*.py), the engine and the watchdog never
write; tests/unit/test_render_only_writer.py checks it over their source.

This module: what the job controls made inert, the streams, notes and errors. The fast path of
`probing PID backtrace` imports it: standard library only, nothing heavy.
"""

from __future__ import annotations

import os
import sys

from ...errors import EvalTimedOut, ProbingError, RemoteError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any, Iterable, Iterator, Optional


# --- what the job controls, made inert ----------------------------------------------------
#
# Thread, function and file names, reprs of locals, table values, eval output, agent error
# messages: the job writes them all, and a job may be hostile (root inspects other users'
# jobs). On a terminal, ESC starts sequences that retitle the window, clear the screen or
# rewrite what is shown; CR and a newline can forge a line ("MainThread ..."). Every such
# string goes through `inert` on its way to people: control characters become visible text
# (\x1b, \r, \n), as Python's repr writes them. JSON and CSV keep the exact values (their
# writers escape them correctly).

ESCAPED = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
ESCAPED.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
# Line and paragraph separators, and bidirectional overrides that reorder what is shown.
ESCAPED.update(
    {code: f"\\u{code:04x}" for code in (0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))}
)
# Bytes that are not UTF-8 in what the job wrote (/proc/PID/environ, file names) decode to lone
# surrogates, which a stream with surrogateescape writes back as those bytes: 0x9b starts a
# terminal sequence as ESC [ does.
ESCAPED.update({code: f"\\udc{code - 0xDC00:02x}" for code in range(0xDC80, 0xDD00)})
_ESCAPED_KEEPING_LINES = {code: text for code, text in ESCAPED.items() if code not in (0x0A, 0x09)}
# Every other lone surrogate (a job that decoded half an emoji from JSON, or built a name with
# chr(0xD83D)) has no UTF-8 form at all: written as is, it fails the write with
# UnicodeEncodeError whatever the stream's error handler. It shows as its escape too, as
# `flamegraph -o -` and render/files.py write it. Kept out of ESCAPED, the table the native front
# end shares (native/front/gen_tables.py): the front end hands such text to this CLI instead.
_SURROGATES = {code: f"\\u{code:04x}" for code in range(0xD800, 0xE000)}
_INERT = {**_SURROGATES, **ESCAPED}
_INERT_KEEPING_LINES = {**_SURROGATES, **_ESCAPED_KEEPING_LINES}


def inert(value: Any) -> str:
    """`value` as text that cannot act on a terminal: every control character made visible."""
    return str(value).translate(_INERT)


def inert_lines(text: str, out: IO[str]) -> str:
    """Multi-line output of the job (eval's prints, a remote traceback) for `out`: on a
    terminal, control characters other than newline and tab are made visible; to a file or
    a pipe, the exact text goes through, but for lone surrogates (no bytes can be written for
    them: they show as their escapes)."""
    try:
        terminal = out.isatty()
    except (AttributeError, ValueError):
        terminal = False
    if terminal:
        return text.translate(_INERT_KEEPING_LINES)
    return writable(text)


def writable(text: str) -> str:
    """`text` with each lone surrogate as its escape (`\\ud83d`), everything else exact: what a
    stream can write whatever its encoding's error handler (csv, a pipe)."""
    return text if text.isascii() else text.translate(_SURROGATES)


def inert_parts(parts: Iterable[str]) -> Iterator[str]:
    """A file's text on its way to standard output (`-o -`): inert_lines on a terminal, exact
    to a pipe."""
    for part in parts:
        yield inert_lines(part, sys.stdout)


class _InertStream:
    """A stream whose every write is made inert except for newlines and tabs: for reports
    (memory) that interleave many job-controlled names with their own layout."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out

    def write(self, text: str) -> int:
        return self._out.write(str(text).translate(_INERT_KEEPING_LINES))

    def flush(self) -> None:
        self._out.flush()


def inert_stream(out: IO[str]) -> IO[str]:
    stream: Any = _InertStream(out)
    return stream  # type: ignore[no-any-return]


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
    first, *rest = hint.translate(_INERT_KEEPING_LINES).split("\n")
    return "\n".join([first, *(line if line[:1].isspace() else "        " + line for line in rest)])


def log_to_stderr(message: str) -> None:
    """A step taken (-v)."""
    sys.stderr.write(f"probing: {inert(message)}\n")


def note(message: str) -> None:
    """A note about the answer (why it came from outside, what the agent cut short)."""
    sys.stderr.write(f"probing: {inert(message)}\n")


def notes(messages: Any) -> None:
    for message in messages:
        note(message)
    sys.stderr.flush()


def stdout_is_closed() -> None:
    """After a BrokenPipeError (`probing ... | head`): silence the flush at exit."""
    _to_devnull(sys.stdout)


def stderr_is_closed() -> None:
    """After a BrokenPipeError on stderr (`probing run ... 2>&1 | head`, the job running on):
    what is still written there goes nowhere."""
    _to_devnull(sys.stderr)


def _to_devnull(stream: IO[str]) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


def log_to_closable_stderr(message: str) -> None:
    """A step taken (-v), for `probing run`: a reader of stderr that went away silences it, and
    the job and its watchdog go on."""
    try:
        log_to_stderr(message)
    except BrokenPipeError:
        stderr_is_closed()
