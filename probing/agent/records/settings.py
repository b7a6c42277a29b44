"""Where records go, what they are called, how big one may be (how many are kept: retention.py).

Read from the environment each time a record is written (a job may set PROBING_RECORD_DIR
after start-up), never cached: nothing here runs while the job is healthy.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import time
from typing import List, Mapping, Optional

from ...protocol.records import SUFFIX

DEFAULT_MAX_MB = 256.0
FATAL_SUFFIX = ".fatal"
_OFF = ("0", "false", "no", "off")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
MAX_STEM_CHARS = 40


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
