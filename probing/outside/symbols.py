"""Whether the native frames of a `--native` read can be named: the interpreter's binary with or
without its symbol table, and which libraries' frames came back as bare addresses.

py-spy names a native frame from the symbol table (.symtab) of the file it lies in, and falls
back on the dynamic symbols (.dynsym) only. A stripped interpreter (Debian's /usr/bin/python3.11)
keeps only the functions it exports: the eval loop, `thread_run`, `lock_PyThread_acquire_lock`
and every other static function of CPython have no name, and py-spy leaves those frames out
(it cannot tell them from the eval loop it replaces by Python frames) or names them after the
nearest exported function. A stack that shows no CPython frame is then no sign that none ran:
the output says so (engine/backtrace.py), as a note, rather than leave the reader to guess.
"""

from __future__ import annotations

import os
import re
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional

_LIBPYTHON = re.compile(r"/libpython3\.\d+[a-z]*\.so[.\d]*$")
_SHT_SYMTAB = 2
# Section headers read at most (a real binary has a few dozen): a hostile file cannot make the
# look read more than this many 64-byte entries.
_MOST_SECTIONS = 4096


def has_symbol_table(path: str) -> Optional[bool]:
    """Whether the ELF file at `path` has a symbol table (.symtab); None when it cannot be told
    (not a 64-bit little-endian ELF file, unreadable, cut short)."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(64)
            if len(header) < 64 or header[:6] != b"\x7fELF\x02\x01":
                return None
            shoff = struct.unpack_from("<Q", header, 0x28)[0]
            shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
            if shoff == 0 or shentsize < 64 or not 0 < shnum <= _MOST_SECTIONS:
                return None
            handle.seek(shoff)
            table = handle.read(shentsize * shnum)
    except OSError:
        return None
    if len(table) < shentsize * shnum:
        return None
    return any(
        struct.unpack_from("<I", table, index * shentsize + 4)[0] == _SHT_SYMTAB for index in range(shnum)
    )


def interpreter_file(pid: int) -> Optional[str]:
    """The file that holds the CPython interpreter of `pid`: its libpython when the executable
    is linked to one (pyenv's --enable-shared builds), else the executable; as this side can open
    it (through /proc/PID/root: the process may live in another mount namespace)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            for line in maps.read(1 << 22).decode("utf-8", "surrogateescape").splitlines():
                path = line.split(None, 5)[5] if line.count(" ") >= 5 else ""
                if _LIBPYTHON.search(path.strip()):
                    return f"/proc/{pid}/root{path.strip()}"
    except (OSError, IndexError):
        pass
    return f"/proc/{pid}/exe"


def _interpreter_name(pid: int, file: str) -> str:
    if file.endswith("/exe"):
        try:
            return os.readlink(file).replace(" (deleted)", "")
        except OSError:
            return "the interpreter"
    return file[len(f"/proc/{pid}/root") :]


def unnamed_libraries(threads: Iterable[Dict[str, Any]]) -> List[str]:
    """The libraries (py-spy's `module`, a file name) of native frames py-spy could only give as
    an address (0x7f...), in the order first seen."""
    found: Dict[str, None] = {}
    for thread in threads:
        for frame in thread.get("frames") or []:
            if not isinstance(frame, dict):
                continue
            module, name = frame.get("module"), frame.get("name")
            if isinstance(module, str) and isinstance(name, str) and name.startswith("0x"):
                found.setdefault(os.path.basename(module), None)
    return list(found)


def native_notes(pid: int, threads: Iterable[Dict[str, Any]]) -> List[str]:
    """What a `--native` reader should know about the frames that carry no name: a stripped
    interpreter (none of CPython's own frames named), and libraries whose frames are addresses."""
    notes = []
    file = interpreter_file(pid)
    if file is not None and has_symbol_table(file) is False:
        notes.append(
            f"{_interpreter_name(pid, file)} is stripped (it has no symbol table): no frame of the "
            "CPython interpreter itself is named, so its C frames are left out between the Python "
            "ones or carry the name of the nearest function it exports (py-spy --native shows the "
            "same); a Python built with its symbols (pyenv's, or the distribution's debug build) "
            "names them"
        )
    unnamed = unnamed_libraries(threads)
    if unnamed:
        notes.append(
            f"frames shown as an address (0x...) lie in {', '.join(unnamed)}, which has no symbol "
            "there: stripped, or a function it does not export"
            if len(unnamed) == 1
            else f"frames shown as an address (0x...) lie in {', '.join(unnamed)}, which have no "
            "symbol there: stripped, or functions they do not export"
        )
    return notes
