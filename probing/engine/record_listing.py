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
import os
import re
import stat
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from ..errors import BadRecord
from ..procfs import process_alive, start_time
from ..protocol.records import SUFFIX, RecordFormatError
from ..protocol.records import read_header as read_record_header
from .record import NO_TRACE, Record, header_problem, read_any, said
from .record_path import FATAL_SUFFIX, open_regular

# At most this many files of a directory are looked at (the agent keeps 20 per machine).
MAX_FILES = 1000
# A process whose start time differs from the record's by more than this is another process
# that was given the same PID.
START_TIME_SLACK_S = 2.0
# Of a .fatal file, a listing reads the header line and this much of faulthandler's text: enough
# for the fatal error's line and the first frames (whether it holds a trace at all).
LISTED_FATAL_BYTES = 64 << 10
# The socket directory the agent makes for user UID (PROBING_SOCKET_DIR unset).
_SOCKET_DIR_OF_UID = re.compile(r"^probing-([0-9]+)$")


class RecordEntry(NamedTuple):
    path: str
    kind: str  # "record", "fatal", "no_trace" or "unreadable"
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
