"""Whether a TARGET names a record file: a regular file ending in .probing or .fatal, one that
starts as a record does, or the temporary file of a record whose write was cut short. Standard
library only (target parsing goes through here on the fast path of `probing PID backtrace`); a
leaf, so target.py can ask without importing the reader."""

from __future__ import annotations

import os
import stat

from ...protocol.records import RECORD_MAGIC, SUFFIX

FATAL_SUFFIX = ".fatal"
# The first bytes of a .fatal file: the line the agent writes when it arms faulthandler.
FATAL_MAGIC = b"#probing-fatal "
# A record of another format version starts with these too: it is a record, to be refused
# by name (BadRecord) rather than taken for a mistyped TARGET.
_RECORD_FAMILY = RECORD_MAGIC[:6]
# The name the agent writes a record under before renaming it into place (protocol/records.py
# write_record): `.NAME.probing.PID.tmp`. A SIGKILL or a full disk during the write leaves it,
# often empty: it is still a record, cut short (exit 15), not a mistyped TARGET (exit 2).
_TEMPORARY_SUFFIX = ".tmp"


def is_record_path(text: str) -> bool:
    """True for a regular file named like a record, or starting like one."""
    if text.isdigit() or "://" in text:
        return False
    try:
        if not stat.S_ISREG(os.stat(text).st_mode):
            return False
    except (OSError, ValueError):
        return False
    if text.endswith((SUFFIX, FATAL_SUFFIX)) or is_temporary_record(text):
        return True
    try:
        fd = open_regular(text)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as handle:
        start = handle.read(len(FATAL_MAGIC))
    return start.startswith(_RECORD_FAMILY) or start == FATAL_MAGIC


def is_temporary_record(path: str) -> bool:
    """Whether `path` is named as the agent names a record while it writes it."""
    name = os.path.basename(path)
    if not (name.startswith(".") and name.endswith(_TEMPORARY_SUFFIX)):
        return False
    record, _, pid = name[1 : -len(_TEMPORARY_SUFFIX)].rpartition(".")
    return pid.isdigit() and record.endswith(SUFFIX) and len(record) > len(SUFFIX)


def open_regular(path: str) -> int:
    """A descriptor of `path` for reading, only if it is a regular file (OSError otherwise).

    Looked at before it is opened: an O_PATH descriptor opens nothing, so a FIFO that would
    block the reader, or a device whose open has effects of its own (root opening
    /dev/watchdog arms it), is never opened; only a regular file is reopened, through that
    descriptor, for reading."""
    probe = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(probe).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.open(f"/proc/self/fd/{probe}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    finally:
        os.close(probe)
