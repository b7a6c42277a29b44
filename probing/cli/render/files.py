"""Files the picture commands write (`trace export -o`, `flamegraph -o`, `report -o`), and the
one line that says what was written.

A file is written whole or not at all: under a temporary name in its own directory, then renamed
onto its name, so a reader (Perfetto, a browser, a script polling the file) never sees half of
it and an existing file is replaced only once the new one is complete, as py-spy and
torch.profiler do. The temporary name is random and created with O_EXCL (tempfile.mkstemp): no
name another user could plant beforehand, and a symlink is never written through. The file is
made 0600 whatever the umask: what a picture shows of a job (argv, cwd, source lines, names) is
the job owner's, and the CLI may run as root. A character device or a named pipe at the path
(/dev/null, /dev/stdout, a pipe a viewer reads) is written into, never replaced; a directory is
refused. `-` writes standard output instead, as UTF-8 bytes
(a lone surrogate, from a name made of bytes that are not UTF-8, shows as \\udcxx).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from typing import Iterable, Optional

from ...errors import ProbingError, UsageError
from . import inert

STDOUT = "-"


def check_output(path: str) -> None:
    """Fail now, before a job is probed, when `path` cannot be written: its directory is missing,
    not a directory or not writable (a usage error, exit 2). A temporary file is made there and
    removed, so a read-only file system is found too."""
    if path == STDOUT or _special_file(path) is not None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    try:
        descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror or error}", hint="") from None
    os.close(descriptor)
    _remove(temporary)


def write_output(path: str, parts: Iterable[str]) -> int:
    """Write the text `parts` make, in order, to `path` (atomically, mode 0600) or stdout (`-`);
    the bytes written. A failure while the parts are made (a target gone mid-way) leaves no file
    behind and whatever was at `path` untouched."""
    if path == STDOUT:
        written = 0
        sys.stdout.flush()
        out = sys.stdout.buffer
        for part in parts:
            data = part.encode("utf-8", "backslashreplace")
            out.write(data)
            written += len(data)
        out.flush()
        return written
    special = _special_file(path)
    if special is not None:
        return _write_into(path, special, parts)
    directory, name = os.path.split(os.path.abspath(path))
    try:
        descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    except OSError as error:
        raise ProbingError(f"cannot write {path}: {error.strerror or error}", hint="") from None
    try:
        # backslashreplace: a lone surrogate (a name the job made of bytes that are not UTF-8)
        # shows as \\udcxx in the file instead of failing the whole write.
        with os.fdopen(descriptor, "w", encoding="utf-8", errors="backslashreplace", newline="") as out:
            for part in parts:
                out.write(part)
            out.flush()
            written = out.tell()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except OSError as error:
        _remove(temporary)
        raise ProbingError(f"cannot write {path}: {error.strerror or error}", hint="") from None
    except BaseException:
        _remove(temporary)
        raise
    return written


def _special_file(path: str) -> Optional[int]:
    """The file type of what `path` leads to when it is no regular file, None when it is one or
    is missing. A rename would put a regular file in place of /dev/null or of a named pipe a
    reader waits on; those are written into instead, and what cannot hold a picture is refused."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return stat.S_IFMT(mode)
    what = "a directory" if stat.S_ISDIR(mode) else "neither a file, a character device nor a pipe"
    raise UsageError(f"cannot write {path}: it is {what}", hint="")


def _write_into(path: str, kind: int, parts: Iterable[str]) -> int:
    """Write into a character device (/dev/null, /dev/stdout) or a named pipe, never creating or
    truncating anything. A pipe with no reader is an error at once (O_NONBLOCK), not a wait."""
    flags = os.O_WRONLY | os.O_NOCTTY | (os.O_NONBLOCK if kind == stat.S_IFIFO else 0)
    try:
        descriptor = os.open(path, flags)
        os.set_blocking(descriptor, True)
        written = 0
        with os.fdopen(descriptor, "wb") as out:
            for part in parts:
                data = part.encode("utf-8", "backslashreplace")
                out.write(data)
                written += len(data)
    except OSError as error:
        reason = "no process reads the pipe" if error.errno == errno.ENXIO else (error.strerror or str(error))
        raise ProbingError(f"cannot write {path}: {reason}", hint="") from None
    return written


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def human_size(size: int) -> str:
    """1234567 -> '1.2 MB' (decimal units, as ls -h --si and browsers show file sizes)."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"  # not reached


def wrote(path: str, size: int, detail: str = "", hint: str = "") -> None:
    """One line on stderr, `probing: wrote PATH (SIZE, DETAIL): HINT`, e.g. `probing: wrote
    step.json (1.2 MB, 51,210 events): open it in https://ui.perfetto.dev or chrome://tracing`.
    Nothing is said for stdout (`-`), where the output is the answer."""
    if path == STDOUT:
        return
    inside = human_size(size) + (f", {detail}" if detail else "")
    tail = f": {hint}" if hint else ""
    sys.stderr.write(f"probing: wrote {inert(path)} ({inert(inside)}){inert(tail)}\n")
    sys.stderr.flush()


def counted(count: int, noun: str) -> str:
    """`1 step`, `2 steps`, `51,210 events`: for the detail of `wrote`."""
    return f"{count:,} {noun}" + ("" if count == 1 else "s")
