"""A record file as a target: what a dead job left, read as the same tables and the same `info`
the commands get from a live process.

Two kinds of file (the agent writes both under PROBING_RECORD_DIR):
  NAME.probing  protocol/records.py's format: a header, then every table the agent held
  NAME.fatal    a header line, then faulthandler's text after a fatal signal (engine/fatal_text.py)

A record is untrusted input (root reads other users' records, and a job may be hostile): the
file is opened only if it is a regular file, its size is bounded, every table goes through
decode_table's checks, and every header field is checked for its type before use; what does not
fit is a BadRecord naming the file and why, never a traceback. A table DuckDB could not hold (no
columns, a name in a schema of DuckDB's own) is left out with a note; a record of more than
MAX_TABLES tables is refused, and reading one below that bound takes time linear in its tables.
"""

from __future__ import annotations

import json
import os
import signal
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ...errors import BadRecord
from ...protocol.frames import MAX_HEADER_BYTES, FrameError
from ...protocol.records import MAX_RECORD_BYTES, RecordFormatError, read_record
from ...protocol.tables import DecodedTable, decode_table
from ...schema.column_check import mismatched_column
from ...schema.rows import backtrace_row
from ...schema.tables import AGENT_TABLES, BACKTRACE
from ...sql.session import table_problem
from ..fatal_text import parse_faulthandler
from .fields import integer, text, texts, timestamp
from .path import FATAL_MAGIC, FATAL_SUFFIX, is_temporary_record, open_regular

if TYPE_CHECKING:
    from ...schema.rows import BacktraceRow
    from .fields import EndingException, RankOf, Reason


# A .fatal file is a header line and faulthandler's text (at most 100 threads of 100 frames):
# anything past this is not faulthandler's, and is left unread.
MAX_FATAL_BYTES = 16 << 20
FATAL_VERSION = 1
# Raises the size of a .probing file read (protocol.records.MAX_RECORD_BYTES, 1 GiB), for a record
# written with a PROBING_RECORD_MAX_MB above it.
READ_MAX_MB_VARIABLE = "PROBING_RECORD_READ_MAX_MB"
# The most tables a record may hold: an agent writes about 15 (AGENT_TABLES), and newer ones may
# write more. Each becomes a DuckDB table of the session a query runs in, with its view: 1 000
# tables of a row each took 4 s to query, 50 000 took minutes; 256 take about 1 s.
MAX_TABLES = 256
# The most of a refusal's reason a message quotes (the rest is the file's, and of any length).
MAX_REASON_CHARS = 300
# Header fields that are times: a value there that is no time (1e30, NaN) is no header an agent
# wrote (it writes time.time()), and would fail every reader that shows it as a date.
_TIME_FIELDS = ("written_at", "started_at")
# faulthandler's words for the signals it handles.
_FATAL_SIGNALS = {
    "Segmentation fault": signal.SIGSEGV,
    "Aborted": signal.SIGABRT,
    "Bus error": signal.SIGBUS,
    "Floating point exception": signal.SIGFPE,
    "Illegal instruction": signal.SIGILL,
}
# A .fatal file with stacks and no fatal error's line: faulthandler.register's dump of SIGTERM or
# SIGHUP, on its way to the default action (one file serves both, so it cannot say which).
DEFAULT_ACTION_DEATH = "SIGTERM or SIGHUP (default action) ended the job: the stacks at that moment"
# The file or function of a frame whose record holds none.
UNKNOWN_NAME = "<unknown>"
NO_TRACE = "ended without a trace (SIGKILL, os._exit, or faulthandler taken by the job)"


class Record:
    """One record file, read. `kind`: "record" (a .probing file) or "fatal" (a .fatal file);
    `tables`: the decoded tables; `backtrace_rows`: python.backtrace parsed from faulthandler's
    text (a .fatal file holds no tables); `notes`: what was left out of it and why."""

    __slots__ = (
        "path",
        "kind",
        "header",
        "tables",
        "backtrace_rows",
        "notes",
        "size",
        "modified",
        "owner",
        "_by_name",
    )

    def __init__(
        self,
        path: str,
        kind: str,
        header: Dict[str, Any],
        tables: List[DecodedTable],
        backtrace_rows: List[BacktraceRow],
        notes: List[str],
        size: int,
        modified: float,
        owner: Tuple[int, int] = (-1, -1),
    ) -> None:
        self.path = path
        self.kind = kind
        self.header = header
        self.tables = tables
        self.backtrace_rows = backtrace_rows
        self.notes = notes
        self.size = size
        self.modified = modified
        self.owner = owner  # (uid, gid) of the file: whose the source files it names are
        self._by_name = {table.name: table for table in tables}

    @property
    def pid(self) -> Optional[int]:
        return integer(self.header.get("pid"))

    def info(self) -> Dict[str, Any]:
        """What the renderers show of the process (as a live agent's hello gives it)."""
        return {
            "pid": self.pid,
            "python_version": text(self.header.get("python_version")),
            "argv": texts(self.header.get("argv")),
        }

    @property
    def written_at(self) -> Optional[float]:
        # A .fatal file's header was written when the agent started; faulthandler wrote the rest
        # at the fault, which the file's modification time tells.
        if self.kind == "fatal":
            return self.modified
        return timestamp(self.header.get("written_at"))

    def reason(self) -> Reason:
        """Why it was written: kind, message, signal, exit_status (each None where unknown)."""
        reason = self.header.get("reason")
        reason = reason if isinstance(reason, dict) else {}
        return {
            "kind": text(reason.get("kind")),
            "message": text(reason.get("message")) or "",
            "signal": integer(reason.get("signal")),
            "exit_status": integer(reason.get("exit_status")),
        }

    def exception(self) -> Optional[EndingException]:
        """The exception that ended the job (type, message, text, thread), if it holds one."""
        exception = self.header.get("exception")
        if not isinstance(exception, dict):
            return None
        return {
            "type": text(exception.get("type")),
            "message": text(exception.get("message")),
            "text": text(exception.get("text")),
            "thread": text(exception.get("thread")),
        }

    def rank(self) -> Optional[RankOf]:
        rank = self.header.get("rank")
        if not isinstance(rank, dict):
            return None
        return {
            "rank": integer(rank.get("rank")),
            "local_rank": integer(rank.get("local_rank")),
            "world_size": integer(rank.get("world_size")),
            "node": integer(rank.get("node")),
        }

    def table_names(self) -> List[str]:
        names = [table.name for table in self.tables]
        if self.backtrace_rows and BACKTRACE.name not in names:
            names.append(BACKTRACE.name)
        return names

    def table(self, name: str) -> Optional[DecodedTable]:
        return self._by_name.get(name)

    def row_count(self, name: str) -> int:
        """How many rows table `name` holds (0 when the record does not hold it)."""
        if name == BACKTRACE.name and self.kind == "fatal":
            return len(self.backtrace_rows)
        table = self.table(name)
        return table.rows if table is not None else 0

    def rows(self, name: str) -> List[Dict[str, Any]]:
        """The rows of table `name` as dicts (empty when the record does not hold it)."""
        if name == BACKTRACE.name and self.kind == "fatal":
            return [dict(row) for row in self.backtrace_rows]
        table = self.table(name)
        return table.to_rows() if table is not None else []

    def described(self) -> List[Dict[str, Any]]:
        """The tables it holds, each with its columns and what they mean (as `tables` prints)."""
        described = []
        for name in self.table_names():
            known = AGENT_TABLES.get(name)
            table = self.table(name)
            if known is not None:
                entry = known.describe()
            else:
                columns = (
                    [{"name": c.name, "type": c.type, "doc": ""} for c in table.columns] if table else []
                )
                entry = {"name": name, "doc": "", "columns": columns}
            rows = table.rows if table is not None else len(self.backtrace_rows)
            described.append(dict(entry, rows=rows))
        return described


def open_record(path: str) -> Record:
    """The record at `path` as a target; BadRecord for anything that cannot be one (the
    message names the file and says why)."""
    record = read_any(path)
    if record.kind == "fatal" and not record.backtrace_rows:
        raise BadRecord(
            f"{path}: PID {record.pid}'s fatal-signal file holds no trace",
            hint="while the process runs, this file is where faulthandler writes if it crashes: "
            f"use `probing {record.pid} COMMAND`; once it is gone, it {NO_TRACE}",
        )
    return record


def read_any(path: str, fatal_text_bytes: int = MAX_FATAL_BYTES) -> Record:
    """A .probing or .fatal file (by its first bytes), without judging an empty .fatal file;
    of a .fatal file's text, no more than `fatal_text_bytes` are read."""
    try:
        fd = open_regular(path)
    except OSError as error:
        raise BadRecord(f"{path}: cannot be read: {error.strerror or error}", hint="") from None
    try:
        with os.fdopen(fd, "rb") as handle:
            start = handle.read(len(FATAL_MAGIC))
            if start == FATAL_MAGIC or (not start and path.endswith(FATAL_SUFFIX)):
                record = _read_fatal(path, handle, fatal_text_bytes)
            else:
                # Reopened through the descriptor: the file checked above, whatever the path is now.
                opened = f"/proc/self/fd/{handle.fileno()}"
                record = _read_probing(path, opened, os.fstat(handle.fileno()))
    except OSError as error:
        raise BadRecord(f"{path}: cannot be read: {error.strerror or error}", hint="") from None
    problem = header_problem(record.header)
    if problem is not None:
        raise BadRecord(f"{path}: {problem}", hint="")
    return record


def header_problem(header: Dict[str, Any]) -> Optional[str]:
    """Why a record's header is not one an agent wrote, in words; None when it can be read.
    Fields of another type are read as missing (record_fields); a time that is no time is
    refused, since every listing and heading shows it as a date."""
    for field in _TIME_FIELDS:
        value = header.get(field)
        if value is not None and timestamp(value) is None:
            return f"its header's {field} ({_shown(value)}) is not a time"
    return None


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def said(reason: Any) -> str:
    """Why a file is refused, as the format's checks word it, in at most MAX_REASON_CHARS: they
    quote what the file says (`it says 'xxx...' tables`), and the file is the job's."""
    text = str(reason)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def _read_probing(path: str, opened: str, status: os.stat_result) -> Record:
    try:
        read = read_record(opened, _read_max_bytes())
    except RecordFormatError as error:
        if is_temporary_record(path):
            # `.NAME.probing.PID.tmp`: the agent writes a record there and renames it when whole.
            raise BadRecord(
                f"{path}: a record whose write was cut short (its temporary file: the job was "
                f"killed, or the disk filled, while writing it)",
                hint=_hint_for("cut short"),
            ) from None
        raise BadRecord(f"{path}: {said(error)}", hint=_hint_for(str(error))) from None
    except (SystemError, RecursionError):
        # protocol.json_loads's C scanner fails this way on some malformed JSON (not ValueError),
        # and on JSON nested deeper than the interpreter's stack.
        raise BadRecord(f"{path}: a frame whose header is not JSON", hint="") from None
    if len(read.tables) > MAX_TABLES:
        raise BadRecord(
            f"{path}: {len(read.tables)} tables, more than the {MAX_TABLES} a record may hold "
            f"(an agent writes about {len(AGENT_TABLES)})",
            hint="",
        )
    notes = texts(read.header.get("notes"))
    tables: List[DecodedTable] = []
    seen = set()  # lower case: DuckDB, which every query goes through, ignores the case of names
    for index, (descriptor, payload) in enumerate(read.tables):
        try:
            table = decode_table(descriptor, payload)
        except FrameError as error:
            raise BadRecord(f"{path}: table {index + 1}: {said(error)}", hint="") from None
        mismatch = mismatched_column(table.name, ((column.name, column.type) for column in table.columns))
        if mismatch is not None:
            raise BadRecord(f"{path}: {said(mismatch)}", hint="") from None
        problem = table_problem(table.name, [(column.name, column.type) for column in table.columns])
        if problem is None and table.name.lower() in seen:
            problem = "a second table of that name"
        if problem is not None:
            notes.append(f"a table named {table.name!r} was left out: {problem}")
            continue
        seen.add(table.name.lower())
        tables.append(table)
    owner = (status.st_uid, status.st_gid)
    return Record(path, "record", read.header, tables, [], notes, status.st_size, status.st_mtime, owner)


def _read_max_bytes() -> int:
    given = os.environ.get(READ_MAX_MB_VARIABLE, "")
    return int(given) << 20 if given.isdecimal() else MAX_RECORD_BYTES


def _hint_for(reason: str) -> Optional[str]:
    if "a record may hold" in reason:
        return f"{READ_MAX_MB_VARIABLE}=MB raises the limit, if the file is a record you trust"
    if "version" in reason:
        return "read it with the probing version that wrote it (`probing_version` in its header)"
    if "cut short" in reason:
        return "the job died while writing it; an older record of the same job may be whole"
    return ""


def _read_fatal(path: str, handle: Any, text_bytes: int) -> Record:
    status = os.fstat(handle.fileno())
    line = handle.readline(MAX_HEADER_BYTES + 64)
    version, _, header_text = line.partition(b" ")
    if not line.endswith(b"\n"):
        raise BadRecord(f"{path}: a fatal-signal file whose header line is cut short or too long", hint="")
    if version != str(FATAL_VERSION).encode():
        raise BadRecord(
            f"{path}: a fatal-signal file of format version {version[:16]!r}; this probing reads "
            f"version {FATAL_VERSION}",
            hint=_hint_for("version"),
        )
    try:
        header = json.loads(header_text.decode("utf-8"))
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise BadRecord(f"{path}: a fatal-signal file whose header is not a JSON object", hint="")
    rest = handle.read(text_bytes)
    notes = []
    if handle.read(1):
        # Named after its table: a query's notes are those about the tables it reads (record_sql.py).
        notes.append(f"python.backtrace: only the first {text_bytes >> 20} MB of faulthandler's text read")
    pid = integer(header.get("pid"))
    message, rows = parse_faulthandler(rest.decode("utf-8", "replace"), pid)
    given = header.get("reason")
    reason: Dict[str, Any] = dict(given) if isinstance(given, dict) else {}
    reason["kind"] = "fatal_signal"
    if message is not None:
        number = _FATAL_SIGNALS.get(message)
        reason.update(message=message, signal=int(number) if number is not None else None)
    elif rows:
        reason.update(kind="signal", message=DEFAULT_ACTION_DEATH, signal=None)
    header = dict(header, reason=reason, tables=[BACKTRACE.name] if rows else [])
    owner = (status.st_uid, status.st_gid)
    return Record(path, "fatal", header, [], rows, notes, status.st_size, status.st_mtime, owner)


def backtrace_rows(record: Record) -> List[BacktraceRow]:
    """python.backtrace of the record with every column the renderers read, whatever the file
    held: a column left out is None, a depth that is not a number sorts as the innermost."""
    rows = []
    # A decoded table's columns have the schema's types (mismatched_column refused it otherwise);
    # a column the file left out is None.
    for row in record.rows(BACKTRACE.name):
        rows.append(backtrace_row(
            pid=row.get("pid"), thread_id=row.get("thread_id"), native_id=row.get("native_id"),
            thread_name=row.get("thread_name"), is_main=row.get("is_main"),
            depth=integer(row.get("depth")) or 0,
            # Read as names (a source file is looked up by it): `<...>` as Python names what has no
            # file, so that nothing is looked up for a frame whose record left the column out.
            func=text(row.get("func")) or UNKNOWN_NAME, file=text(row.get("file")) or UNKNOWN_NAME,
            lineno=integer(row.get("lineno")), frame_type=row.get("frame_type"), locals=row.get("locals"),
            source=row.get("source"),
        ))  # fmt: skip
    return rows
