"""What the report reads of the job's own files, bounded: the source lines its stacks show, and
the torch version of the package its memory maps name.

The job names these paths and may be hostile; the CLI may run as root. Every file goes through
sources._read_regular_file (an O_PATH look first: a FIFO or a device is never opened) with a
size cap, and what a whole report reads is capped too. One file reached through many names
(symlinks, /proc/PID/root) is read once: files are keyed by (device, inode). Only the bytes are
kept, not a list of lines (a file of short lines as Python strings is 20 times its size).
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional, Tuple

from ..sources import UNSET, Reader, _read_regular_file, candidate_paths, reader_for_process

# A source file bigger than this shows no lines in a report (code is rarely over 1 MB).
FILE_BYTES = 4 << 20
# What one report reads of source files in all; files past it show no lines.
TOTAL_BYTES = 32 << 20
VERSION_FILE_BYTES = 8192

FileKey = Tuple[int, int]


class ReportSources:
    """Lines of the job's source files for one report, with the caps above."""

    def __init__(self, pid: Optional[int], reader: Optional[Reader] = UNSET) -> None:
        self.pid = pid
        self.reader = reader_for_process(pid) if reader is UNSET else reader
        self.read_bytes = 0
        self.left_unread = 0  # files not read because of a cap
        self._keys: Dict[str, Optional[FileKey]] = {}
        self._files: Dict[FileKey, bytes] = {}
        self._lines: Dict[Tuple[FileKey, int], str] = {}

    def line(self, filename: str, lineno: Optional[int]) -> str:
        if not lineno or lineno < 1 or filename.startswith("<"):
            return ""
        if filename not in self._keys:
            self._keys[filename] = self._load(filename)
        key = self._keys[filename]
        if key is None:
            return ""
        found = self._lines.get((key, lineno))
        if found is None:
            pieces = self._files[key].split(b"\n", lineno)
            raw = pieces[lineno - 1] if len(pieces) >= lineno else b""
            found = self._lines[(key, lineno)] = raw.decode("utf-8", "replace").strip()
        return found

    def _load(self, filename: str) -> Optional[FileKey]:
        # The path itself, then under the job's root; with a reader, only what it could read.
        for path, identity in candidate_paths(filename, self.pid, self.reader):
            try:
                info = os.stat(path)  # follows symlinks without opening anything
            except (OSError, ValueError):
                continue
            key = (info.st_dev, info.st_ino)
            if key in self._files:
                return key
            room = min(FILE_BYTES, TOTAL_BYTES - self.read_bytes)
            try:
                data = _read_regular_file(path, room, identity) if room > 0 else None
            except (OSError, ValueError):
                continue
            if data is None:
                self.left_unread += 1
                return None
            self.read_bytes += len(data)
            self._files[key] = data
            return key
        return None


def torch_version_of(pid: Optional[int]) -> Optional[str]:
    """The torch version a local process has loaded, read from outside: the torch package its
    memory maps show (libtorch's directory, under the job's own root), then that package's
    version.py, a regular file of at most VERSION_FILE_BYTES. Nothing runs in the job; None
    when it has no torch loaded or the file cannot be read."""
    if pid is None:
        return None
    package = None
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                path = line.rstrip("\n").split(" ", 5)[-1].strip()
                marker = path.rfind("/torch/lib/")
                if marker >= 0 and path.startswith("/"):
                    package = path[: marker + len("/torch")]
                    break
    except OSError:
        return None
    if package is None:
        return None
    try:
        data = _read_regular_file(f"/proc/{pid}/root{package}/version.py", VERSION_FILE_BYTES)
    except (OSError, ValueError):
        return None
    if data is None:
        return None
    source = data.decode("utf-8", "replace")
    found = re.search(r"""^__version__\s*=\s*['"]([^'"\n]{1,64})['"]""", source, re.MULTILINE)
    return found.group(1) if found else None
