"""Lines of the job's source files, for tracebacks and reports."""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional


# A bigger "source file" shows no lines (the native front end reads the same rule from here).
MAX_SOURCE_BYTES = 64 << 20


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
                data = _read_regular_file(path)
            except (OSError, ValueError):
                continue
            if data is not None:
                return data.decode("utf-8", "replace").splitlines()
        return []


def _read_regular_file(path: str, limit: Optional[int] = None) -> Optional[bytes]:
    """The bytes of `path` if it is a regular file of at most `limit` bytes (MAX_SOURCE_BYTES
    unless given), else None.

    The job names the path, a job may be hostile, and the CLI may run as root. O_PATH looks at
    what the path is without opening it: a device's open may act (/dev/watchdog arms, a tape
    rewinds, /dev/tty takes a terminal), a FIFO's would wait for a writer. Only a regular file
    is then opened, through the same inode (native/front/sources.c read_whole does the same)."""
    if limit is None:
        limit = MAX_SOURCE_BYTES
    where = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        info = os.fstat(where)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        fd = os.open(f"/proc/self/fd/{where}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(where)
    try:
        chunks: List[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > limit:
                return None
            chunks.append(chunk)
    finally:
        os.close(fd)
