"""Files the picture commands write (`trace export -o`, `flamegraph -o`, `report -o`), and the
one line that says what was written.

A file is written whole or not at all: under a temporary name in its own directory, then renamed
onto its name, so a reader (Perfetto, a browser, a script polling the file) never sees half of
it and an existing file is replaced only once the new one is complete, as py-spy and
torch.profiler do. The temporary name is random and created with O_EXCL (tempfile.mkstemp): no
name another user could plant beforehand, and a symlink is never written through. The file is
made 0600 whatever the umask: what a picture shows of a job (argv, cwd, source lines, names) is
the job owner's, and the CLI may run as root. `-` writes standard output instead, as UTF-8 bytes
(a lone surrogate, from a name made of bytes that are not UTF-8, shows as \\udcxx).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Iterable

from ...errors import ProbingError, UsageError
from . import inert

STDOUT = "-"


def check_output(path: str) -> None:
    """Fail now, before a job is probed, when `path` cannot be written: its directory is missing,
    not a directory or not writable (a usage error, exit 2). A temporary file is made there and
    removed, so a read-only file system is found too."""
    if path == STDOUT:
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
