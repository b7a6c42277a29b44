"""Lines of the job's source files, for tracebacks and reports.

The job names the paths (a frame's co_filename is whatever its code object says), and the CLI
may run as root: a job, or a record another user wrote, could name /etc/shadow at line 1 and
have root print it. So when root reads for a job of another user, a line comes only from a file
that user could have read itself: every directory on the way searchable by it, every symlink
followed as the kernel would, the file readable by it (`Reader`, `readable_as`). A CLI that
is not root needs no such check: the kernel makes it, and it inspects only its own jobs.
"""

from __future__ import annotations

import collections
import os
import stat

from ..procfs import file_credentials

# No typing at run time: `probing PID backtrace` reads source lines through here
# (CONTRIBUTING.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, FrozenSet, List, Optional, Tuple

    FileIdentity = Tuple[int, int]  # (st_dev, st_ino)

    from ..schema.rows import BacktraceRow


# A bigger "source file" shows no lines (the native front end reads the same rule from here).
MAX_SOURCE_BYTES = 64 << 20
# Symlinks followed to reach one file, as the kernel's own limit (ELOOP).
_MAX_LINKS = 40


class Reader:
    """Whose permissions the job's files are read with: its user and groups. (A plain class: a
    NamedTuple would import typing on the way of every backtrace.)"""

    __slots__ = ("uid", "gids")

    def __init__(self, uid: int, gids: FrozenSet[int]) -> None:
        self.uid = uid
        self.gids = gids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Reader) and (self.uid, self.gids) == (other.uid, other.gids)

    def __hash__(self) -> int:
        return hash((self.uid, self.gids))

    def __repr__(self) -> str:
        return f"Reader(uid={self.uid}, gids={sorted(self.gids)})"


# Nobody in particular: a file and its directories readable by anyone, or no line.
NOBODY = Reader(-1, frozenset())


def reader_for_process(pid: Optional[int]) -> Optional[Reader]:
    """How the files of process `pid` may be read: None (the kernel checks, or the job is
    root's) or the job's user. A job whose user cannot be told (gone, or not on this machine)
    is read as nobody's."""
    if os.geteuid() != 0:
        return None
    credentials = file_credentials(pid) if pid is not None else None
    if credentials is None:
        return NOBODY
    uid, gids = credentials
    return None if uid == 0 else Reader(uid, gids)


def reader_for_owner(uid: int, gid: int) -> Optional[Reader]:
    """How the files a record names may be read: as the user who owns the record file."""
    if os.geteuid() != 0 or uid == 0:
        return None
    return Reader(uid, frozenset([gid]))


# The default of `reader` arguments: work it out from the PID.
UNSET = Reader(-2, frozenset())


class SourceLines:
    """Lines of the job's source files, read by the CLI so the target does no file I/O.
    `reader`: whose permissions apply (default: the user of process `pid`, reader_for_process)."""

    def __init__(self, pid: Optional[int], reader: Optional[Reader] = UNSET) -> None:
        self.pid = pid
        self.reader = reader_for_process(pid) if reader is UNSET else reader
        self._files: Dict[str, List[str]] = {}

    def line(self, filename: str, lineno: Optional[int]) -> str:
        if not lineno or filename.startswith("<"):
            return ""
        lines = self._files.get(filename)
        if lines is None:
            lines = self._files[filename] = self._read(filename)
        return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""

    def frame_line(self, frame: BacktraceRow) -> str:
        """The source line a python.backtrace row stands at."""
        return self.line(str(frame["file"]), frame["lineno"])

    def _read(self, filename: str) -> List[str]:
        for path, identity in candidate_paths(filename, self.pid, self.reader):
            try:
                data = _read_regular_file(path, identity=identity)
            except (OSError, ValueError):
                continue
            if data is not None:
                return data.decode("utf-8", "replace").splitlines()
        return []


def candidate_paths(
    filename: str, pid: Optional[int], reader: Optional[Reader]
) -> List[Tuple[str, Optional[FileIdentity]]]:
    """Where the job's `filename` may be read, in order: the path itself, then under the job's
    own root (a job in a container sees its files there). With a reader, only those it could
    open itself, each with the identity of the file that was checked: what is opened later
    must be that file (a directory swapped for a symlink meanwhile leads to another)."""
    roots = ["", f"/proc/{pid}/root"] if pid else [""]
    if reader is None:
        return [(root + filename, None) for root in roots]
    return [found for found in (readable_as(reader, filename, root) for root in roots) if found is not None]


def _permits(reader: Reader, info: os.stat_result, bit: int) -> bool:
    """Whether `reader` has permission `bit` (4 read, 1 search) on a file, as the mode says."""
    if info.st_uid == reader.uid:
        return bool(info.st_mode & (bit << 6))
    if info.st_gid in reader.gids:
        return bool(info.st_mode & (bit << 3))
    return bool(info.st_mode & bit)


def readable_as(reader: Reader, filename: str, root: str = "") -> Optional[Tuple[str, FileIdentity]]:
    """The path, symlinks resolved, and the identity of the file under which `reader` could
    open `filename` for reading
    (absolute symlinks and `..` stay within `root`, as they would for a process whose root it
    is); None when it could not: a directory on the way it may not search, a file it may not
    read, not a regular file, a relative name (the job's working directory is not the CLI's),
    too many symlinks, or anything missing."""
    if not filename.startswith("/"):
        return None
    pending = collections.deque(part for part in filename.split("/") if part)
    resolved: List[str] = []
    links = 0
    try:
        while pending:
            name = pending.popleft()
            if name in (".", ""):
                continue
            if name == "..":
                if resolved:
                    resolved.pop()
                continue
            directory = root + "/" + "/".join(resolved)
            if not _permits(reader, os.stat(directory), 1):
                return None
            path = directory.rstrip("/") + "/" + name
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                links += 1
                if links > _MAX_LINKS:
                    return None
                target = os.readlink(path)
                if target.startswith("/"):
                    resolved = []
                pending.extendleft(reversed([part for part in target.split("/") if part]))
                continue
            resolved.append(name)
        path = root + "/" + "/".join(resolved)
        info = os.lstat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(info.st_mode) or not _permits(reader, info, 4):
        return None
    return path, (info.st_dev, info.st_ino)


def _read_regular_file(
    path: str, limit: Optional[int] = None, identity: Optional[FileIdentity] = None
) -> Optional[bytes]:
    """The bytes of `path` if it is a regular file of at most `limit` bytes (MAX_SOURCE_BYTES
    unless given) and, when `identity` is given, that very file; else None.

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
        if identity is not None and (info.st_dev, info.st_ino) != identity:
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
