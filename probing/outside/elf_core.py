"""Whether a file is a whole ELF core file, read from its headers before any reader is started.

pystack's own answers for a file that is not a core, or a core cut short, are about what it then
failed to find ("Could not gather enough information ..."); the headers say what is wrong in
words a user can act on. Only a few hundred bytes of the (untrusted) file are read.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from typing import BinaryIO, Tuple

from ..errors import BadRecord, PermissionDenied, UsageError

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
ET_CORE = 4
# e_phnum's value when the count does not fit: the real count is in section header 0's sh_info.
PN_XNUM = 0xFFFF
# More program headers than any real core has (one per mapping, Linux caps mappings at 65530
# by default): a header claiming more is refused rather than read.
MAX_PROGRAM_HEADERS = 1 << 20
_ELF_TYPES = {1: "a relocatable object file", 2: "an executable", 3: "a shared library or executable"}


class CoreFile:
    """A core file open for reading (`descriptor`, which the reader process is given), whose
    headers showed a whole 64-bit little-endian ELF core; `status`: its fstat."""

    __slots__ = ("path", "descriptor", "status")

    def __init__(self, path: str, descriptor: int, status: os.stat_result) -> None:
        self.path = path
        self.descriptor = descriptor
        self.status = status

    def close(self) -> None:
        if self.descriptor >= 0:
            os.close(self.descriptor)
            self.descriptor = -1

    def __enter__(self) -> CoreFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_core_file(path: str) -> CoreFile:
    """The core at `path`, open, once its headers are checked; raises UsageError (no such file,
    a directory), PermissionDenied, or BadRecord saying what is wrong."""
    descriptor, status = _open_regular(path)
    try:
        with os.fdopen(os.dup(descriptor), "rb") as handle:
            _check_headers(path, handle, status.st_size)
    except BaseException:
        os.close(descriptor)
        raise
    return CoreFile(path, descriptor, status)


def _open_regular(path: str) -> Tuple[int, os.stat_result]:
    """`path` open for reading, if it is a regular file. Root may be handed a path where another
    user put a FIFO or a link to a device (/dev/watchdog arms the watchdog when it is opened), so
    the path is first opened with O_PATH, which opens nothing, and reopened for reading through
    /proc/self/fd only when fstat shows a regular file."""
    try:
        anchor = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except PermissionError:
        raise _not_allowed(path) from None
    except OSError as error:
        raise BadRecord(f"cannot read {path}: {os.strerror(error.errno or errno.EIO)}") from None
    try:
        status = os.fstat(anchor)
        if stat.S_ISDIR(status.st_mode):
            raise UsageError(f"{path} is a directory, not a core file")
        if not stat.S_ISREG(status.st_mode):
            raise BadRecord(f"{path} is not a regular file, so not a core file")
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        return os.open(f"/proc/self/fd/{anchor}", flags), status
    except PermissionError:
        raise _not_allowed(path) from None
    except OSError as error:
        raise BadRecord(f"cannot read {path}: {os.strerror(error.errno or errno.EIO)}") from None
    finally:
        os.close(anchor)


def _not_allowed(path: str) -> PermissionDenied:
    return PermissionDenied(
        f"not allowed to read {path}",
        hint="a core file is readable by its owner only (mode 0600): read it as that user, or as root",
    )


def _check_headers(path: str, handle: BinaryIO, size: int) -> None:
    header = handle.read(64)
    if len(header) < 64 or header[:4] != ELF_MAGIC:
        raise BadRecord(f"{path} is not a core file (no ELF header)")
    if header[4] != ELFCLASS64 or header[5] != ELFDATA2LSB:
        raise BadRecord(
            f"{path} is not a 64-bit little-endian ELF file: probing reads cores of x86-64 and arm64"
        )
    e_type = struct.unpack_from("<H", header, 16)[0]
    if e_type != ET_CORE:
        what = _ELF_TYPES.get(e_type, f"an ELF file of type {e_type}")
        raise BadRecord(f"{path} is {what}, not a core file")
    phoff, shoff = struct.unpack_from("<QQ", header, 32)
    phentsize, phnum, shentsize = struct.unpack_from("<HHH", header, 54)
    if phnum == PN_XNUM:
        phnum = _extended_count(path, handle, shoff, shentsize)
    if phentsize < 56 or phnum > MAX_PROGRAM_HEADERS:
        raise BadRecord(f"{path}: its ELF header is damaged ({phnum} program headers of {phentsize} bytes)")
    table_end = phoff + phentsize * phnum
    if table_end > size:
        raise _cut_short(path, size, table_end)
    handle.seek(phoff)
    table = handle.read(phentsize * phnum)
    needed = table_end
    for index in range(phnum):
        # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz
        offset, filesz = struct.unpack_from("<QQQQ", table, index * phentsize + 8)[0::3]
        needed = max(needed, offset + filesz)
    if needed > size:
        raise _cut_short(path, size, needed)


def _extended_count(path: str, handle: BinaryIO, shoff: int, shentsize: int) -> int:
    if shoff == 0 or shentsize < 64:
        raise BadRecord(f"{path}: its ELF header is damaged (no section header for its program header count)")
    handle.seek(shoff)
    section = handle.read(64)
    if len(section) < 64:
        raise BadRecord(f"{path} is cut short (its section headers are missing)")
    return int(struct.unpack_from("<I", section, 44)[0])


def _cut_short(path: str, size: int, needed: int) -> BadRecord:
    return BadRecord(
        f"{path} is cut short: {size} bytes of the {needed} its headers describe",
        hint="a core is cut short when the disk filled up, when `ulimit -c` limited its size, or when "
        "it was copied in part; write it again (`ulimit -c unlimited`, or gcore PID)",
    )
