"""Read the Python stacks of a core file with pystack and print them as one JSON document.

Run as a program, by file path, in a process of its own (probing/outside/core_process.py starts
it with a deadline, in a session of its own, the core open on descriptor 3): the core is
untrusted input (root may read any user's core) and pystack parses it in native code, so a core
made to crash or hang the parser ends this process, not the CLI. Before the core is parsed this
process confines itself (`limit`, `become`): no core of its own, a bound on the memory it
allocates, no new
privileges by exec, and with --run-as, the uid and gid of the core's owner.
Standard library and pystack only: with `python -I` nothing beside this file is imported.

Prints {"reading": {...}} on success (exit 0), or {"failure": KIND, "message": TEXT} (exit 3)
where KIND is one of FAILURES. Everything printed is bounded (MAX_* below).
"""

from __future__ import annotations

import json
import os
import resource
import stat
import sys
from json.encoder import encode_basestring_ascii  # what json.dump writes for a str
from typing import Any, Dict, List, Optional, Tuple

# Exit status of a failure this program understood (the CLI reads the JSON on stdout).
FAILED = 3
FAILURES = ("no_pystack", "not_confined", "not_allowed", "not_core", "no_executable", "wrong_executable",
            "not_python", "unreadable")  # fmt: skip
PR_SET_NO_NEW_PRIVS = 38

# Bounds on what is printed: a core may hold any number of threads and frames, of any length.
MAX_THREADS = 4096
MAX_FRAMES = 100_000  # in all threads together
MAX_TEXT = 1000  # characters of a file or function name
MAX_LOCALS = 64  # per frame
MAX_REPR = 300  # characters of a local's repr
MAX_OUTPUT = 32_000_000  # bytes of names and reprs as printed (JSON-escaped), and a little for the rest


def cut(value: Any, limit: int = MAX_TEXT) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fail(kind: str, message: str) -> int:
    json.dump({"failure": kind, "message": cut(message, 4000)}, sys.stdout)
    return FAILED


def fail_with(kind: str, error: Exception) -> int:
    """A failure of `kind`, unless it is a file this process may not read (pystack says so in a
    RuntimeError from std::filesystem): that is not the core's fault."""
    said = str(error)
    if "Permission denied" in said:
        return fail("not_allowed", f"{said}, read as uid {os.getuid()}")
    return fail(kind, said)


def executable_of(analyzer: Any) -> Tuple[str, Optional[str]]:
    """The executable to read the core with, and the one the core names when that is not on
    this machine. If the named one is no ELF file (a path cut short, a file since removed), the
    first ELF file mapped into the process, as `pystack core` does: for an interpreter linked to
    libpython, that library serves as well."""
    named = str(analyzer.extract_executable())
    if is_elf(named):
        return named, None
    missing = None if os.path.exists(named) else named
    for mapped in analyzer.extract_maps():
        path = getattr(mapped, "path", None)
        if path is not None and is_elf(str(path)):
            return str(path), missing
    return named, missing


def is_elf(path: str) -> bool:
    """Whether `path` is a regular file that starts as an ELF file does. The path comes from the
    core: it may name a FIFO, a terminal or a device whose open does something (/dev/watchdog
    arms the watchdog), so it is opened with O_PATH (which opens nothing) and only a regular
    file is reopened, through /proc/self/fd, to be read."""
    try:
        anchor = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(anchor).st_mode):
            return False
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        descriptor = os.open(f"/proc/self/fd/{anchor}", flags)
    except OSError:
        return False
    finally:
        os.close(anchor)
    with open(descriptor, "rb") as handle:
        return handle.read(4) == b"\x7fELF"


def gone(named: str, process: Dict[str, Any]) -> str:
    command = str(process.get("psargs") or "").strip()
    run_as = f" (the process ran `{cut(command, 200)}`)" if command else ""
    return f"the core names the executable {named}{run_as}, which is not on this machine"


def wrong_executable(found: str, said: str) -> str:
    """pystack names every mapping of the core's own executable, once per segment."""
    _, _, maps = said.partition("Available executable maps:")
    named = list(dict.fromkeys(part.strip() for part in maps.split(",") if part.strip()))
    if not named:
        return f"the core has no mapping of {found}"
    return f"the core has no mapping of {found}; its executable is {', '.join(named[:3])}"


def frame_locals(frame: Any) -> Dict[str, str]:
    merged = dict(list(frame.arguments.items())[:MAX_LOCALS])
    for name, value in frame.locals.items():
        if len(merged) >= MAX_LOCALS:
            break
        merged.setdefault(name, value)
    return {cut(name, 200): cut(value, MAX_REPR) for name, value in merged.items()}


class Budget:
    """What may still be printed: frames, and bytes of names and reprs, counted as json.dump
    writes them (a non-ASCII character takes 6 or 12)."""

    def __init__(self) -> None:
        self.frames = MAX_FRAMES
        self.bytes = MAX_OUTPUT

    def spend(self, *texts: str) -> None:
        self.bytes -= sum(len(encode_basestring_ascii(text)) for text in texts)

    def spent(self) -> bool:
        return self.frames <= 0 or self.bytes <= 0


def thread_document(thread: Any, with_locals: bool, budget: Budget) -> Dict[str, Any]:
    """One thread, its frames innermost first (pystack walks them outermost first); when the
    budget runs out, the outermost frames are the ones left out."""
    frames: List[Dict[str, Any]] = []
    for frame in reversed(list(thread.frames)):
        if budget.spent():
            break
        code = frame.code
        values = frame_locals(frame) if with_locals else None
        file, func = cut(code.filename), cut(code.scope)
        frames.append({"file": file, "func": func, "lineno": int(code.location.lineno), "locals": values})
        budget.frames -= 1
        budget.bytes -= 70  # the keys, the line number and the punctuation of a frame
        budget.spend(file, func, *(values or {}).keys(), *(values or {}).values())
        budget.bytes -= 4 * len(values or {})
    return {
        "tid": int(thread.tid),
        "name": cut(thread.name) if thread.name else None,
        "holds_gil": bool(thread.holds_the_gil > 0),
        "python_version": list(thread.python_version) if thread.python_version else None,
        "frames": frames,
    }


def _unusable_executable(found: str, process: Dict[str, Any]) -> Optional[int]:
    """The failure (as `fail` returns it) when the executable cannot serve to read the core;
    None when it can."""
    if not os.path.exists(found):
        return fail("no_executable", gone(found, process))
    if not os.access(found, os.R_OK):
        return fail("not_allowed", f"{found} cannot be read by uid {os.getuid()}, as whom the core is read")
    if not is_elf(found):
        return fail("no_executable", f"{found} is not an executable (no ELF header)")
    return None


def _reading(
    found: str, process: Dict[str, Any], failure: Dict[str, Any], documents: List[Dict[str, Any]],
    budget: Budget,
) -> Dict[str, Any]:  # fmt: skip
    """What the core says: the process, the signal that ended it, its threads."""
    return {
        "executable": cut(found),
        "pid": process.get("pid"),
        "ppid": process.get("ppid"),
        "uid": process.get("uid"),
        "command": cut(process.get("fname") or ""),
        "arguments": cut(process.get("psargs") or "", 4000),
        "signal": failure.get("si_signo"),
        "fault_address": failure.get("failed_addr"),
        "threads": documents,
        "cut_short": budget.spent() or len(documents) >= MAX_THREADS,
        "read_as": [os.getuid(), os.getgid()],
    }


def read(core: str, executable: Optional[str], with_locals: bool, run_as: Optional[Tuple[int, int]]) -> int:
    try:
        from pystack.engine import (
            CoreFileAnalyzer,
            NativeReportingMode,
            StackMethod,
            get_process_threads_for_core,
        )
        from pystack.errors import EngineError, NotEnoughInformation
    except ImportError as error:
        return fail("no_pystack", f"pystack cannot be imported here ({error})")
    # pystack is imported (trusted code, from files the owner of the core may not be able to
    # read); what it parses from here on is not trusted.
    try:
        become(run_as)
    except OSError as error:
        return fail("not_confined", str(error))
    try:
        analyzer = CoreFileAnalyzer(core)
        process = analyzer.extract_ps_info()
        failure = analyzer.extract_failure_info()
        found, missing = executable_of(analyzer) if executable is None else (executable, None)
    except RuntimeError as error:
        return fail_with("not_core", error)
    unusable = _unusable_executable(found, process)
    if unusable is not None:
        return unusable
    try:
        threads = get_process_threads_for_core(
            core, found, native_mode=NativeReportingMode.OFF, locals=with_locals, method=StackMethod.AUTO
        )
        documents: List[Dict[str, Any]] = []
        budget = Budget()
        for thread in threads:
            if len(documents) >= MAX_THREADS or budget.spent():
                break
            documents.append(thread_document(thread, with_locals, budget))
    except NotEnoughInformation as error:
        return fail("unreadable", str(error))
    except EngineError as error:
        said = str(error).replace("Engine error: ", "", 1)
        if "Unable to find maps for the executable" in said:
            return fail("wrong_executable", wrong_executable(found, said))
        if missing is not None:
            # A mapped library stood in for the executable and held no interpreter: an
            # interpreter not linked to libpython, whose own file is needed.
            return fail("no_executable", gone(missing, process))
        return fail("not_python", f"its executable is {found}, and {said[:1].lower()}{said[1:]}")
    except RuntimeError as error:
        return fail_with("unreadable", error)
    reading = _reading(found, process, failure, documents, budget)
    json.dump({"reading": reading}, sys.stdout)
    return 0


def limit(memory: Optional[int]) -> None:
    # A parser that crashes on a hostile core must not write a core of its own (over the one
    # being read, if the working directory is where that one lies); one made to allocate must
    # fail here, not make the machine run out of memory. RLIMIT_DATA, not RLIMIT_AS: the parser
    # maps the core and every library it names read-only (a 163 MB core of a job that imported
    # torch took 1.8 GB of address space, 45 MB of it resident), which costs the machine no
    # memory, and a limit on the address space would refuse the cores of jobs with large
    # libraries (CUDA's are gigabytes); what the parser allocates is what RLIMIT_DATA counts.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory is not None:
        resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))


def become(run_as: Optional[Tuple[int, int]]) -> None:
    """Forbid gaining privileges by exec (a set-uid program) from here on, then drop to `run_as`
    (uid, gid) for good, with no supplementary groups; raises OSError if any step fails."""
    import ctypes  # before the drop: the owner of the core may not be allowed to read it

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if run_as is None:
        return
    uid, gid = run_as
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise OSError(f"still uid {os.getresuid()}, gid {os.getresgid()}, groups {os.getgroups()}")


def main(argv: List[str]) -> int:
    usage = "usage: core_reader.py CORE [EXECUTABLE] [--locals] [--memory BYTES] [--run-as UID:GID]\n"
    options: Dict[str, str] = {}
    positional: List[str] = []
    arguments = iter(argv)
    for argument in arguments:
        if argument in ("--memory", "--run-as"):
            options[argument] = next(arguments, "")
        elif argument != "--locals":
            positional.append(argument)
    try:
        memory = int(options["--memory"]) if "--memory" in options else None
        run_as: Optional[Tuple[int, int]] = None
        if "--run-as" in options:
            uid, gid = (int(part) for part in options["--run-as"].split(":"))
            run_as = (uid, gid)
    except ValueError:
        positional = []
    if len(positional) not in (1, 2):
        sys.stderr.write(usage)
        return 2
    limit(memory)
    return read(positional[0], positional[1] if len(positional) == 2 else None, "--locals" in argv, run_as)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
