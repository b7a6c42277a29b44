"""`probing records`: the records on this machine, newest first, each read only as far as its
header (a record may hold a million-row table; a listing reads a few kilobytes of each).

Where: PROBING_RECORD_DIR, else `<socket dir>/records` (PROBING_SOCKET_DIR or
/tmp/probing-UID). Run as root with neither set, every user's default directory
(/tmp/probing-*/records) is read too: root inspects other users' jobs, as `probing list` does.
A directory is read only if it is a real directory (not a symlink), mode 0700, as the agent
creates it; under /tmp/probing-UID, that directory must be a real one too, and both must be
UID's (a user could otherwise point root at any directory, or name another user's); the files
in it are untrusted all the same: a file that cannot be read, or whose header is not one an agent
wrote, costs its own line ("unreadable: why"), never the listing.
"""

from __future__ import annotations

import glob
import math
import os
import re
import stat
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ...errors import BadRecord
from ...procfs import process_alive, start_time
from ...protocol.frames import json_loads
from ...protocol.records import PRUNED_LOG, PRUNED_LOG_OLDER, SUFFIX, RecordFormatError
from ...protocol.records import read_header as read_record_header
from .path import FATAL_SUFFIX, open_regular
from .record import NO_TRACE, Record, header_problem, read_any, said

# At most this many files of a directory are looked at (the agent keeps 200 per directory).
MAX_FILES = 1000
# A process whose start time differs from the record's by more than this is another process
# that was given the same PID.
START_TIME_SLACK_S = 2.0
# Of a .fatal file, a listing reads the header line and this much of faulthandler's text: enough
# for the fatal error's line and the first frames (whether it holds a trace at all).
LISTED_FATAL_BYTES = 64 << 10
# Of an agent's pruned log (and its rotated older part), a listing reads at most this much each
# (the agent rotates it at 64 KB) and lists at most this many removals, the newest.
PRUNED_LOG_READ_BYTES = 256 << 10
MAX_PRUNED = 500
_WHY_CHARS = 400
_PRUNED_NAME = re.compile(r"^[^/\x00]+(?:\.probing|\.fatal)$")
_PID_IN_NAME = re.compile(r"-([0-9]{1,7})(?:-[0-9]{8}-[0-9]{6}(?:-[0-9]+)?\.probing|(?:-[0-9]{8,})?\.fatal)$")
# The socket directory the agent makes for user UID (PROBING_SOCKET_DIR unset).
_SOCKET_DIR_OF_UID = re.compile(r"^probing-([0-9]+)$")


class RecordEntry(NamedTuple):
    path: str
    kind: str  # "record", "fatal", "no_trace", "unreadable" or "pruned"
    written_at: Optional[float]
    pid: Optional[int]
    argv: List[str]
    reason: str  # kind: message
    rank: Optional[int]
    size: int


def record_directories() -> List[str]:
    """Where records are looked for, by default."""
    chosen = os.environ.get("PROBING_RECORD_DIR")
    if chosen:
        return [chosen]
    socket_dir = os.environ.get("PROBING_SOCKET_DIR") or f"/tmp/probing-{os.geteuid()}"
    directories = [os.path.join(socket_dir, "records")]
    if os.geteuid() == 0 and not os.environ.get("PROBING_SOCKET_DIR"):
        found = [
            path
            for path in glob.glob("/tmp/probing-*/records")
            if _SOCKET_DIR_OF_UID.match(os.path.basename(os.path.dirname(path)))
        ]
        directories += sorted(path for path in found if path not in directories)
    return directories


def _trusted(directory: str) -> bool:
    """A real directory of mode 0700; under a socket directory named for a UID, both real
    directories (lstat: neither a symlink) owned by that UID."""
    try:
        status = os.lstat(directory)
    except OSError:
        return False
    if not stat.S_ISDIR(status.st_mode) or stat.S_IMODE(status.st_mode) != 0o700:
        return False
    parent = os.path.dirname(os.path.normpath(directory))
    named = _SOCKET_DIR_OF_UID.match(os.path.basename(parent))
    if named is None:
        return True
    try:
        parent_status = os.lstat(parent)
    except OSError:
        return False
    uid = int(named.group(1))
    return stat.S_ISDIR(parent_status.st_mode) and parent_status.st_uid == uid == status.st_uid


def list_records(directories: List[str], given: bool = False) -> List[RecordEntry]:
    """Every record in `directories`, newest first. `given`: the user named the directory,
    so one that is not 0700 is read anyway (they chose it)."""
    entries: List[RecordEntry] = []
    for directory in directories:
        if not given and not _trusted(directory):
            continue
        try:
            names = sorted(os.listdir(directory))[:MAX_FILES]
        except OSError:
            continue
        for name in names:
            if name.startswith(".") or not name.endswith((SUFFIX, FATAL_SUFFIX)):
                continue  # a record being written is a hidden temporary file
            if not _regular_entry(os.path.join(directory, name)):
                continue  # the agent writes files, never links: a link points elsewhere
            entry = _entry(os.path.join(directory, name))
            if entry is not None:
                entries.append(entry)
    entries.sort(key=lambda entry: entry.written_at or 0.0, reverse=True)
    return entries


def list_pruned(directories: List[str], given: bool = False) -> List[RecordEntry]:
    """The records agents removed from `directories` to keep them within their bounds (their
    pruned logs), newest removal first, as entries of kind "pruned" whose `reason` says when,
    by which process and why. A log is the job's writing, read as untrusted: a line that is not
    one an agent wrote is skipped."""
    pruned: List[Tuple[float, RecordEntry]] = []
    for directory in directories:
        if not given and not _trusted(directory):
            continue
        for name in (PRUNED_LOG_OLDER, PRUNED_LOG):
            for line in _log_lines(os.path.join(directory, name)):
                entry = _pruned_entry(directory, line)
                if entry is not None:
                    pruned.append(entry)
    pruned.sort(key=lambda item: item[0], reverse=True)
    return [entry for _, entry in pruned[:MAX_PRUNED]]


def _log_lines(path: str) -> List[bytes]:
    """The whole lines of the last PRUNED_LOG_READ_BYTES of a log (none if it is not a regular file)."""
    try:
        fd = open_regular(path)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - PRUNED_LOG_READ_BYTES))
            text = handle.read(PRUNED_LOG_READ_BYTES)
        except OSError:
            return []
    lines = text.split(b"\n")
    if size > PRUNED_LOG_READ_BYTES:
        lines = lines[1:]  # the first was cut by the seek
    return [line for line in lines if line.strip()]


def _pruned_entry(directory: str, line: bytes) -> Optional[Tuple[float, RecordEntry]]:
    """(when it was removed, its entry) for a line of a pruned log; None for a line an agent
    did not write."""
    try:
        logged = json_loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(logged, dict):
        return None
    name, why, size = logged.get("name"), logged.get("why"), logged.get("bytes")
    written, removed, by = logged.get("written_at"), logged.get("pruned_at"), logged.get("by_pid")
    if not (isinstance(name, str) and _PRUNED_NAME.match(name) and isinstance(why, str)):
        return None
    if not (_a_time(written) and _a_time(removed)) or type(size) is not int or size < 0:
        return None
    assert isinstance(written, (int, float)) and isinstance(removed, (int, float))
    by_text = f" by PID {by}" if type(by) is int else ""
    found = _PID_IN_NAME.search(name)
    reason = f"pruned {_local_time(removed)}{by_text}: {why[:_WHY_CHARS]}"
    entry = RecordEntry(os.path.join(directory, name), "pruned", float(written),
                        int(found.group(1)) if found else None, [], reason, None, size)  # fmt: skip
    return float(removed), entry


def _a_time(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and 0 <= value < 1e11


def _local_time(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _regular_entry(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _entry(path: str) -> Optional[RecordEntry]:
    try:
        if path.endswith(FATAL_SUFFIX):
            return _fatal_entry(path)
        header, status = read_header(path)
    except BadRecord as error:
        return _unreadable(path, error.message)
    except OSError as error:
        return _unreadable(path, str(error.strerror or error))
    problem = header_problem(header)
    if problem is not None:
        return _unreadable(path, problem)
    return _from_record(Record(path, "record", header, [], [], [], status.st_size, status.st_mtime), "record")


def _unreadable(path: str, why: str) -> RecordEntry:
    # The reader's messages name the file (they are errors of `probing FILE ...` too); the
    # listing's line shows it already, and cuts the reason to fit.
    why = why[len(path) + 2 :] if why.startswith(path + ": ") else why
    try:
        status = os.lstat(path)
    except OSError:
        return RecordEntry(path, "unreadable", None, None, [], f"unreadable: {why}", None, 0)
    return RecordEntry(
        path, "unreadable", status.st_mtime, None, [], f"unreadable: {why}", None, status.st_size
    )


def _from_record(record: Record, kind: str) -> RecordEntry:
    reason = record.reason()
    text = reason["kind"] or "?"
    if reason["message"]:
        text += f": {reason['message']}"
    rank = record.rank()
    written = record.modified if kind == "no_trace" else record.written_at
    return RecordEntry(record.path, kind, written, record.pid, record.info()["argv"], text,
                       rank["rank"] if rank else None, record.size)  # fmt: skip


def _fatal_entry(path: str) -> Optional[RecordEntry]:
    record = read_any(path, LISTED_FATAL_BYTES)
    if record.pid is not None and _same_process_alive(record.pid, record.header.get("started_at")):
        return None  # its armed fault handler: the job is running
    if record.backtrace_rows:
        return _from_record(record, "fatal")
    return _from_record(record, "no_trace")._replace(reason=NO_TRACE)


def _same_process_alive(pid: int, started_at: Any) -> bool:
    if not process_alive(pid):
        return False
    if not isinstance(started_at, (int, float)):
        return True
    started = start_time(pid)
    return started is None or abs(started - float(started_at)) <= START_TIME_SLACK_S


def read_header(path: str) -> Tuple[Dict[str, Any], os.stat_result]:
    """A .probing file's header (its first frame) and its stat, reading no further; BadRecord
    (the message says why) for a file that is not a record this probing reads."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as handle:
        status = os.fstat(handle.fileno())
        try:
            return read_record_header(handle, status.st_size), status
        except RecordFormatError as error:
            raise BadRecord(said(error)) from None
