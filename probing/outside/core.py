"""The Python stacks of a core file, read with pystack in a process of its own, as
python.backtrace rows with source = 'pystack'.

The core is untrusted input: its headers are checked here first (outside/elf_core.py), then
outside/core_reader.py parses it in a child process with a deadline, which prints one bounded
JSON document; that document is read here as defensively as py-spy's (outside/pyspy.py).
"""

from __future__ import annotations

import os
import stat
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ..errors import BadRecord, PermissionDenied, ProbingError, UsageError
from ..protocol.frames import json_dumps, json_loads
from ..schema.rows import backtrace_row
from .core_process import CORE_IN_READER, confinement_arguments, run_as_of, run_reader
from .elf_core import open_core_file

if TYPE_CHECKING:
    from ..schema.rows import BacktraceRow
from .spawn import TimedOut, TooMuchOutput

READER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "core_reader.py")
SOURCE = "pystack"
# The reader bounds what it prints (core_reader.MAX_OUTPUT bytes, and the JSON around them); past
# this the reader is killed: it is not printing what it was written to.
MAX_READING_BYTES = 64 << 20
_MAX_TEXT = 4000

_PASS_EXE = "pass the interpreter that wrote the core: probing core CORE --exe /path/to/python3"


class CoreReading:
    """What the reader found in a core: the process (pid, argv, the signal that ended it), and
    python.backtrace rows, main thread first; `gil` holds the native id of the thread that held
    the GIL, if any."""

    __slots__ = ("path", "executable", "pid", "arguments", "signal", "fault_address", "python_version",
                 "rows", "gil", "cut_short", "read_as")  # fmt: skip

    def __init__(self, path: str) -> None:
        self.path = path
        self.executable: Optional[str] = None
        self.pid: Optional[int] = None
        self.arguments = ""
        self.signal: Optional[int] = None
        self.fault_address: Optional[int] = None
        self.python_version: Optional[str] = None
        self.rows: List[BacktraceRow] = []
        self.gil: Optional[int] = None
        self.cut_short = False
        # (uid, gid) the reader ran as, as it says.
        self.read_as: Optional[Tuple[int, int]] = None


def reader_command(executable: Optional[str], locals: bool, confinement: List[str]) -> List[str]:
    """`python -I`: neither the working directory (where a core may lie among the job's files)
    nor PYTHON* variables decide what the reader imports. The reader reads the core from the
    descriptor it is given (core_process.CORE_IN_READER)."""
    command = [sys.executable, "-I", READER, CORE_IN_READER]
    command += [executable] if executable else []
    return command + (["--locals"] if locals else []) + confinement


def read_core(
    core: str,
    executable: Optional[str] = None,
    locals: bool = False,
    timeout: float = 60.0,
    log: Optional[Callable[[str], None]] = None,
) -> CoreReading:
    """The stacks in the core at `core`; raises BadRecord (exit 15) when it cannot be read."""
    if executable is not None and not os.path.isfile(executable):
        raise UsageError(f"--exe {executable}: no such file")
    with open_core_file(core) as opened:
        run_as = run_as_of(opened)
        if run_as is not None and not opened.status.st_mode & stat.S_IRUSR:
            # The reader, run as the owner, reads the core through /proc/self/fd, which checks
            # the owner's access to it.
            raise PermissionDenied(
                f"{core} is not readable by its owner (uid {run_as[0]}), as whom probing reads it",
                hint=f"chmod u+r {core}",
            )
        # The reader may run as another user, in another working directory's stead.
        exe = os.path.abspath(executable) if executable else None
        command = reader_command(exe, locals, confinement_arguments(opened))
        if log is not None:
            log(f"reading the core with pystack: {' '.join(command)}")
        try:
            status, stdout, stderr = run_reader(command, opened, timeout, MAX_READING_BYTES)
        except TimedOut:
            raise BadRecord(
                f"pystack did not read {core} within {timeout:g} s",
                hint="raise --timeout for a very large core",
            ) from None
        except TooMuchOutput as error:
            raise BadRecord(
                f"pystack could not read {core}: the reader printed more than {error.cap >> 20} MiB on "
                f"{error.stream}, more than it may (a core it cannot parse)"
            ) from None
    reading = parse_reading(core, status, stdout, stderr)
    if log is not None and reading.read_as is not None:
        log(f"the reader ran as uid {reading.read_as[0]}, gid {reading.read_as[1]}")
    return reading


def parse_reading(core: str, status: int, stdout: bytes, stderr: bytes) -> CoreReading:
    """The reader's output as a CoreReading, or the ProbingError its failure means."""
    document: Any = None
    if len(stdout) <= MAX_READING_BYTES:
        try:
            document = json_loads(stdout.decode("utf-8", "replace"))
        except ValueError:
            document = None
    if isinstance(document, dict) and isinstance(document.get("failure"), str):
        # The reader knows the core as the descriptor it was given; the user, by its path.
        message = _text(document.get("message")).replace(CORE_IN_READER, core)
        raise _failure(core, document["failure"], message)
    if not isinstance(document, dict) or not isinstance(document.get("reading"), dict):
        raise BadRecord(f"pystack could not read {core}: {_what_went_wrong(status, stderr)}")
    return reading_from_document(core, document["reading"])


def _what_went_wrong(status: int, stderr: bytes) -> str:
    if status < 0:
        return f"the reader was killed by signal {-status} (a core it cannot parse)"
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    return _text(lines[-1]) if lines else f"the reader exited with status {status} and printed nothing usable"


def _failure(core: str, kind: str, message: str) -> ProbingError:
    if kind == "no_pystack":
        return ProbingError(
            f"pystack is needed to read core files: {message}", hint="pip install 'probing[core]' (pystack)"
        )
    if kind == "no_executable":
        return BadRecord(f"{core}: {message}", hint=_PASS_EXE)
    if kind == "wrong_executable":
        return BadRecord(
            f"--exe does not match the core {core}: {message}", hint="leave --exe out, or name that file"
        )
    if kind == "not_python":
        return BadRecord(f"{core} is not the core of a Python process pystack can read: {message}")
    if kind == "not_confined":
        return BadRecord(f"probing could not confine the reader of {core}, so did not read it: {message}")
    if kind == "not_allowed":
        return PermissionDenied(
            f"pystack could not read {core}: {message}",
            hint="run as root, probing reads another user's core as that user, and the files it names "
            "must be readable by them; to read one as root, read a copy owned by root",
        )
    if kind == "not_core":
        return BadRecord(f"{core} is not a core file pystack can read ({message})")
    return BadRecord(f"pystack could not read the Python stacks in {core}: {message}", hint=_PASS_EXE)


def _text(value: Any) -> str:
    """Text of at most _MAX_TEXT characters. A lone surrogate (the reader writes a name that was
    not UTF-8 with \\udcXX escapes) stays that escape, as the agent ships names: one that is not
    UTF-8 fails wherever the text goes (DuckDB refuses it, so does a strict stdout)."""
    text = "" if value is None else str(value)
    text = text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_INT64 = 1 << 63


def _integer(value: Any) -> Optional[int]:
    """An integer a BIGINT column holds; anything else (a bool, a float, one of 64 bits or more)
    is not what the reader prints, and None."""
    if isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64:
        return value
    return None


def reading_from_document(core: str, document: Dict[str, Any]) -> CoreReading:
    """Rows from the reader's document, each field checked: what is not of its type is dropped."""
    reading = CoreReading(core)
    executable = document.get("executable")
    reading.executable = _text(executable) if isinstance(executable, str) else None
    reading.pid = _integer(document.get("pid"))
    reading.arguments = _text(document.get("arguments") or "").strip()
    reading.signal = _integer(document.get("signal"))
    reading.fault_address = _integer(document.get("fault_address"))
    reading.cut_short = document.get("cut_short") is True
    read_as = document.get("read_as")
    if isinstance(read_as, list) and len(read_as) == 2 and None not in map(_integer, read_as):
        reading.read_as = (read_as[0], read_as[1])
    threads = document.get("threads")
    threads = [thread for thread in threads if isinstance(thread, dict)] if isinstance(threads, list) else []
    versions = [thread.get("python_version") for thread in threads]
    version = next((each for each in versions if isinstance(each, list) and len(each) == 2), None)
    if version is not None and all(_integer(part) is not None for part in version):
        reading.python_version = f"{version[0]}.{version[1]}"
    command = _text(document.get("command") or "")
    ordered = sorted(threads, key=lambda thread: (_integer(thread.get("tid")) != reading.pid,
                                                  _integer(thread.get("tid")) or 0))  # fmt: skip
    for thread in ordered:
        tid = _integer(thread.get("tid"))
        if thread.get("holds_gil") is True and reading.gil is None:
            reading.gil = tid
        reading.rows.extend(
            _thread_rows(reading.pid, tid, _thread_name(thread, tid, reading.pid, command), thread)
        )
    return reading


def _thread_name(thread: Dict[str, Any], tid: Optional[int], pid: Optional[int], command: str) -> str:
    """The threading name is not in what pystack reads; a thread the job named at the OS level
    (torch's pt_autograd_0) keeps that name, the others are named as py-spy names them."""
    if tid is not None and tid == pid:
        return "MainThread"
    name = thread.get("name")
    if isinstance(name, str) and name and name != command:
        return _text(name)
    return f"Thread-{tid}"


def _thread_rows(
    pid: Optional[int], tid: Optional[int], name: str, thread: Dict[str, Any]
) -> List[BacktraceRow]:
    listed = thread.get("frames")
    frames = [frame for frame in listed if isinstance(frame, dict)] if isinstance(listed, list) else []
    rows = []
    for depth, frame in enumerate(frames):
        values = frame.get("locals")
        if isinstance(values, dict) and values:
            shown: Optional[str] = json_dumps({_text(key): _text(value) for key, value in values.items()})
        else:
            shown = None
        rows.append(
            backtrace_row(
                pid=pid,
                thread_id=None,  # the Python ident: not in what pystack reads
                native_id=tid,
                thread_name=name,
                is_main=tid is not None and tid == pid,
                depth=depth,
                func=_text(frame.get("func")),
                file=_text(frame.get("file")),
                lineno=_integer(frame.get("lineno")),
                frame_type="Python",
                locals=shown,
                source=SOURCE,
            )
        )
    return rows
