"""Fatal signals (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL): the `.fatal` file.

No Python runs after a segfault, and a signal handler may neither allocate nor take the GIL,
so the record of a fault is prepared while the job is healthy: at agent start a file
`<stem>-<pid>.fatal` is opened with one line of header, and `faulthandler` is enabled on it.
faulthandler writes every thread's Python stack the way it must be written at that moment
(from the interpreter's thread states, without the GIL or malloc), then hands the signal to
the previous handler, so the job still dies (and dumps core) as it would have. The CLI reads
the file as a record (records-contract.md). A normal exit or detach removes the file.

A job that enabled faulthandler itself (python -X faulthandler, PYTHONFAULTHANDLER, or
faulthandler.enable() before the agent started) keeps it: faulthandler has one output, and
taking it would silence the job's own dump; no .fatal file is made and the records say so.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from typing import IO, Any, Dict, List, Optional, Tuple

from ...originals import json_dumps
from ..sockets import high_descriptor
from . import settings

FATAL_LINE_PREFIX = "#probing-fatal 1 "


class FatalFile:
    """The `.fatal` file of this process, while faulthandler writes into it."""

    def __init__(self, path: str, stream: IO[str], pid: int) -> None:
        self.path = path
        self.stream = stream
        self.pid = pid
        self.fd = stream.fileno()
        self.identity = _identity(self.fd)

    def ours(self) -> bool:
        """Whether faulthandler still writes into our file: it holds a reference to the file
        object it writes to, and drops it when the job enables it on another file."""
        return faulthandler.is_enabled() and sys.getrefcount(self.stream) > _BASE_REFERENCES

    def close(self, remove: bool) -> None:
        """Give faulthandler back (only if it is still ours) and close; `remove` deletes the
        file (a clean exit or a detach: there was no fault to keep)."""
        if self.ours():
            faulthandler.disable()
        try:
            self.stream.close()  # opened with closefd=False: the descriptor is closed below
        except (OSError, ValueError):
            pass
        # A job that closed every descriptor (os.closerange) may have this number for a file of
        # its own by now: closed only while it is still our file.
        if _identity(self.fd) == self.identity:
            try:
                os.close(self.fd)
            except OSError:
                pass
        if remove and os.getpid() == self.pid:
            try:
                os.unlink(self.path)
            except OSError:
                pass


# References to the stream when only FatalFile (its attribute) and getrefcount's argument hold it.
_BASE_REFERENCES = 2


def _identity(fd: int) -> Optional[Tuple[int, int]]:
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def open_fatal_file(directory: str, header: Dict[str, Any], notes: List[str]) -> Optional[FatalFile]:
    """Open the file and enable faulthandler on it; None (and a note) when the job has
    faulthandler on already or the file cannot be made."""
    if faulthandler.is_enabled():
        notes.append(
            "fatal signals: faulthandler was enabled by the job, which keeps it (its own dump goes "
            "where it chose); no .fatal file"
        )
        return None
    path = os.path.join(directory, settings.fatal_name(os.getpid()))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            # An earlier process with this PID (PIDs are reused) left it, maybe with a trace:
            # kept under a name of its own.
            os.rename(path, f"{path[: -len(settings.FATAL_SUFFIX)]}-{int(os.lstat(path).st_mtime)}.fatal")
            fd = os.open(path, flags, 0o600)
    except Exception as error:  # noqa: BLE001 - the other hooks go on without it
        notes.append(f"fatal signals: no .fatal file ({_why(error)})")
        return None
    try:
        fd = high_descriptor(fd)
        stream = os.fdopen(fd, "w", encoding="utf-8", errors="replace", closefd=False)
    except Exception as error:  # noqa: BLE001
        _discard(path, None, fd)
        notes.append(f"fatal signals: no .fatal file ({_why(error)})")
        return None
    try:
        # A full disk fails here, after the file was made: it must not stay behind, empty and
        # open, for every job that starts (`probing records` would list each as a death).
        stream.write(FATAL_LINE_PREFIX + json_dumps(header) + "\n")
        stream.flush()
        fatal = FatalFile(path, stream, os.getpid())
        faulthandler.enable(stream, all_threads=True)
    except Exception as error:  # noqa: BLE001
        _discard(path, stream, fd)
        notes.append(f"fatal signals: no .fatal file ({_why(error)})")
        return None
    return fatal


def _why(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror  # "No space left on device", without the errno's number
    return f"{type(error).__name__}: {error}"


def _discard(path: str, stream: Optional[IO[str]], fd: int) -> None:
    """Undo a .fatal file that could not be prepared: closed, and removed."""
    if stream is not None:
        try:
            # Its buffer still holds the header that did not fit; dropped with it, unwritten.
            stream.close()
        except (OSError, ValueError):
            pass
    try:
        os.close(fd)
    except OSError:
        pass
    try:
        os.unlink(path)
    except OSError:
        pass
