"""Where records go, what they are called, how many are kept, how big one may be.

Read from the environment each time a record is written (a job may set PROBING_RECORD_DIR
after start-up), never cached: nothing here runs while the job is healthy.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import time
from typing import List, Mapping, Optional

from ...originals import wall_time
from ...protocol.records import SUFFIX

DEFAULT_KEEP = 20
DEFAULT_MAX_MB = 256.0
FATAL_SUFFIX = ".fatal"
_OFF = ("0", "false", "no", "off")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
MAX_STEM_CHARS = 40
# A record's temporary file this old was left by a write that was cut (SIGKILL): removed.
STALE_TEMPORARY_S = 3600.0


class RecordDirRefused(Exception):
    """The record directory is not one the agent may write into; the message says why."""


def enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """PROBING_RECORD=0 (or off/false/no) turns records off."""
    env = os.environ if environ is None else environ
    return env.get("PROBING_RECORD", "").strip().lower() not in _OFF


def record_dir(environ: Optional[Mapping[str, str]] = None) -> str:
    """PROBING_RECORD_DIR, or `records` beside the agents' sockets."""
    env = os.environ if environ is None else environ
    explicit = env.get("PROBING_RECORD_DIR", "").strip()
    if explicit:
        return explicit
    socket_dir = env.get("PROBING_SOCKET_DIR") or f"/tmp/probing-{os.geteuid()}"
    return os.path.join(socket_dir, "records")


def keep_count(environ: Optional[Mapping[str, str]] = None) -> int:
    """PROBING_RECORD_KEEP: how many records the directory keeps (at least 1)."""
    env = os.environ if environ is None else environ
    try:
        return max(1, int(env.get("PROBING_RECORD_KEEP", "") or DEFAULT_KEEP))
    except ValueError:
        return DEFAULT_KEEP


def max_bytes(environ: Optional[Mapping[str, str]] = None) -> int:
    """PROBING_RECORD_MAX_MB as bytes: the most the tables of one record may take."""
    env = os.environ if environ is None else environ
    try:
        megabytes = float(env.get("PROBING_RECORD_MAX_MB", "") or DEFAULT_MAX_MB)
    except ValueError:
        megabytes = DEFAULT_MAX_MB
    return max(1, int(megabytes * (1 << 20)))


def prepare_dir(path: str) -> str:
    """Create `path` 0700 if missing; RecordDirRefused unless it is a real directory owned by
    this uid with mode 0700 (a shared /tmp: someone else's directory could be read or swapped)."""
    try:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=0o700, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise RecordDirRefused(f"cannot create {path}: {error.strerror or error}") from None
    try:
        info = os.lstat(path)
    except OSError as error:
        raise RecordDirRefused(f"{path}: {error.strerror or error}") from None
    if stat.S_ISLNK(info.st_mode):
        raise RecordDirRefused(f"{path} is a symbolic link")
    if not stat.S_ISDIR(info.st_mode):
        raise RecordDirRefused(f"{path} is not a directory")
    if info.st_uid != os.geteuid():
        raise RecordDirRefused(f"{path} belongs to uid {info.st_uid}, not to uid {os.geteuid()}")
    if stat.S_IMODE(info.st_mode) != 0o700:
        raise RecordDirRefused(f"{path} has mode {stat.S_IMODE(info.st_mode):o}, not 700")
    if not os.access(path, os.W_OK | os.X_OK):
        raise RecordDirRefused(f"{path} is not writable")
    return path


def stem(argv: Optional[List[str]] = None) -> str:
    """The job's name in file names: the script's base name without .py; `-m` jobs by their
    module (runpy leaves the module's file in argv[0]); `python` for -c and the REPL."""
    args = list(sys.argv if argv is None else argv)
    first = args[0] if args else ""
    if first in ("", "-c", "-"):
        name = "python"
    else:
        name = os.path.basename(first)
        if name == "__main__.py":
            name = os.path.basename(os.path.dirname(first)) or "python"
        if name.endswith(".py"):
            name = name[:-3]
    return _UNSAFE.sub("_", name)[:MAX_STEM_CHARS] or "python"


def record_name(pid: int, when: float, argv: Optional[List[str]] = None) -> str:
    return f"{stem(argv)}-{pid}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(when))}{SUFFIX}"


def fatal_name(pid: int, argv: Optional[List[str]] = None) -> str:
    return f"{stem(argv)}-{pid}{FATAL_SUFFIX}"


def unique_path(directory: str, name: str) -> str:
    """`name` in `directory`, with -2, -3... before the suffix when a record of this process
    was already written this second."""
    path = os.path.join(directory, name)
    base = name[: -len(SUFFIX)]
    number = 1
    while os.path.lexists(path):
        number += 1
        path = os.path.join(directory, f"{base}-{number}{SUFFIX}")
    return path


def prune(directory: str, keep: int) -> List[str]:
    """Remove this uid's oldest `.probing` files in `directory` beyond the newest `keep`, whatever
    job or rank wrote them; the oldest `.fatal` files of processes that are gone beyond the newest
    `keep` too (a live job's is its own); and temporary files of records whose write was cut
    (`.NAME.PID.tmp`, older than STALE_TEMPORARY_S). What it removed."""
    uid = os.geteuid()
    records = []
    fatal = []
    stale = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if name.startswith("."):
            if name.endswith(".tmp") and SUFFIX + "." in name and _stale(os.path.join(directory, name), uid):
                stale.append((0.0, name, os.path.join(directory, name)))
            continue
        is_record, is_fatal = name.endswith(SUFFIX), name.endswith(FATAL_SUFFIX)
        if not is_record and not is_fatal:
            continue
        path = os.path.join(directory, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            continue
        if is_record:
            records.append((info.st_mtime, name, path))
        elif not _alive(name[: -len(FATAL_SUFFIX)].rsplit("-", 1)[-1]):
            fatal.append((info.st_mtime, name, path))
    removed = []
    for found, kept in ((records, keep), (fatal, keep), (stale, 0)):
        found.sort(reverse=True)
        for _, _, path in found[kept:]:
            try:
                os.unlink(path)
                removed.append(path)
            except OSError as error:
                if error.errno != errno.ENOENT:
                    continue
    return removed


def _stale(path: str, uid: int) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    old = wall_time() - info.st_mtime > STALE_TEMPORARY_S
    return stat.S_ISREG(info.st_mode) and info.st_uid == uid and old


def _alive(pid_text: str) -> bool:
    """Whether the PID a `.fatal` name ends with runs (a renamed one ends with a time: never)."""
    return pid_text.isdecimal() and os.path.exists(f"/proc/{int(pid_text)}")
