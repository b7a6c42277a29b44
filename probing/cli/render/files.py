"""Files the picture commands write (`trace export -o`, `flamegraph -o`, `report -o`), and the
one line that says what was written.

A file is written whole or not at all: under a temporary name in its own directory, then renamed
onto its name, so a reader (Perfetto, a browser, a script polling the file) never sees half of
it and an existing file is replaced only once the new one is complete, as py-spy and
torch.profiler do. The temporary name is created with O_EXCL|O_NOFOLLOW: a symlink planted where
it goes is never written through. `-` writes standard output instead.
"""

from __future__ import annotations

import os
import sys
from typing import Iterable

from ...errors import ProbingError
from . import inert

STDOUT = "-"


def write_output(path: str, parts: Iterable[str]) -> int:
    """Write the text `parts` make, in order, to `path` (atomically) or stdout (`-`); the bytes
    written. A failure while the parts are made (a target gone mid-way) leaves no file behind
    and whatever was at `path` untouched."""
    if path == STDOUT:
        written = 0
        out = sys.stdout
        for part in parts:
            out.write(part)
            written += len(part.encode("utf-8"))
        out.flush()
        return written
    directory, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        descriptor = os.open(temporary, flags, 0o644)
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
