"""Stacks read from outside the process with py-spy: no agent, no cooperation, no GIL.

Used when the agent cannot answer (the GIL held forever, attach impossible), for native
frames (`--native`), and for descendants without an agent (`--children`). The rows are
python.backtrace rows with source = 'py-spy'.
"""

from __future__ import annotations

import os
import sys
import time

from ..errors import ExitCode, PermissionDenied, ProbingError
from ..procfs import thread_name
from ..protocol.frames import json_dumps, json_loads
from ..schema.rows import backtrace_row
from . import spawn
from .gil import keeps_the_gil, live_thread

# typing, json, shutil, pathlib and subprocess stay unimported: this module is on the path of
# `probing PID backtrace` when a stuck job is read from outside, timed against py-spy itself.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

    from ..schema.rows import BacktraceRow

# py-spy sometimes cannot read a process that is starting up; one retry settles it, within
# the same deadline (a read that ran out of time is not tried again).
_ATTEMPTS = 2
# The least time a read from outside is given, whatever --timeout says (docs/decisions.md,
# "What --timeout covers"), so that a small --timeout meant for the agent does not fail a read a
# loaded machine would finish: py-spy dumps a job in ~20 ms on an idle machine; with probing at
# nice 19 behind a CPU hog per core, 40 dumps of a torch job took 0.01 s at the median and 2.3 s
# at the slowest. (--native took 3-16 s there: no floor worth waiting on covers it.)
OUTSIDE_FLOOR_S = 3.0


def outside_budget(timeout: float) -> float:
    """The seconds a read from outside (py-spy) gets in a command whose --timeout is `timeout`."""
    return max(timeout, OUTSIDE_FLOOR_S)


class OutsideTimeout(ProbingError):
    """py-spy did not finish reading the process within the time --timeout gave the read."""

    exit_code = ExitCode.ERROR

    def __init__(self, what: str, budget: float, after: str = "") -> None:
        # A suggestion four times the time that ran out: past the slowdown a loaded machine
        # made in py-spy's reads (tests/integration/hostile/test_outside_under_load.py).
        raise_to = max(10, int(budget * 4 + 0.999))
        super().__init__(
            f"{what} within {budget:g} s{after}, the time a read from outside gets (--timeout, at least "
            f"{OUTSIDE_FLOOR_S:g} s)",
            hint=f"raise --timeout, e.g. --timeout {raise_to}: py-spy is slower on a loaded machine, "
            "and --native slower still",
        )


class OutsideView:
    """The stacks of a process read with py-spy: python.backtrace rows, which thread holds the
    GIL ("thread 'x' holds the GIL in f (file.py:12)", if any), and py-spy's own threads (for
    the thread states)."""

    __slots__ = ("rows", "gil_holder", "threads")

    def __init__(self, rows: List[BacktraceRow], gil_holder: Optional[str], threads: List[Dict[str, Any]]):
        self.rows = rows
        self.gil_holder = gil_holder
        self.threads = threads


def py_spy() -> Optional[str]:
    """py-spy beside this interpreter (the same environment), else the first on PATH."""
    candidates = [os.path.join(os.path.dirname(sys.executable), "py-spy")]
    candidates += [
        os.path.join(folder, "py-spy") for folder in os.environ.get("PATH", "").split(os.pathsep) if folder
    ]
    return next((path for path in candidates if os.access(path, os.X_OK) and not os.path.isdir(path)), None)


def dump(
    pid: int, native: bool = False, timeout: float = OUTSIDE_FLOOR_S, locals: bool = False
) -> List[Dict[str, Any]]:
    """py-spy's JSON dump of every thread, read within `outside_budget(timeout)` (its retry
    included); raises ProbingError when it cannot read them, OutsideTimeout when out of time."""
    binary = py_spy()
    if binary is None:
        raise ProbingError("py-spy is not installed", hint="pip install py-spy")
    command = [binary, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
    command += ["--locals"] if locals else []
    error: Optional[ProbingError] = None
    budget = outside_budget(timeout)
    deadline = time.monotonic() + budget
    # Started by the native front end for a job stuck on its GIL, with these very arguments.
    handed = spawn.handed_over(pid, usable=not native and not locals)
    for attempt in range(_ATTEMPTS):
        left = deadline - time.monotonic()
        if attempt and left <= 0:
            break
        try:
            if handed is not None:
                child, handed = handed, None
                _, stdout, stderr = spawn.collect(child, left, binary)
            else:
                _, stdout, stderr = spawn.run(command, left)
        except spawn.TimedOut:
            if error is not None:  # the retry ran out of time: the first failure says more
                break
            raise OutsideTimeout(f"py-spy did not read the stacks of PID {pid}", budget) from None
        except spawn.TooMuchOutput as too_much:
            raise ProbingError(
                f"py-spy printed more than {too_much.cap >> 20} MB on its {too_much.stream} reading PID {pid}"
            ) from None
        try:
            threads = threads_of(pid, stdout, stderr, native)
        except PermissionDenied:
            raise
        except ProbingError as failed:
            error = failed
            continue
        return checked_gil(pid, threads)
    assert error is not None
    raise error


def threads_of(pid: int, stdout: bytes, stderr: bytes, native: bool = False) -> List[Dict[str, Any]]:
    """What py-spy printed as its list of threads, each in the shape py-spy documents (`_thread`);
    the ProbingError its failure means. py-spy reads the job's memory, which the job controls:
    every field is checked here, so that nothing downstream meets a type it does not expect."""
    try:
        threads = json_loads(stdout.decode("utf-8", "replace"))
    except ValueError:
        raise _dump_failed(pid, stderr.decode("utf-8", "replace"), native) from None
    if not isinstance(threads, list) or not all(isinstance(thread, dict) for thread in threads):
        raise ProbingError(f"py-spy printed something other than a list of threads for PID {pid}")
    return [_thread(thread) for thread in threads]


# The most of py-spy's words one message quotes: its error is one line of a message of ours.
_MAX_SAID = 300
_INT64 = 1 << 63


def _integer(value: Any) -> Optional[int]:
    """An integer a table column (BIGINT) can hold, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64:
        return value
    return None


def _text(value: Any) -> Optional[str]:
    """Text, with a lone surrogate (from a \\udcXX escape) written as that escape, as the agent
    ships names: what cannot be UTF-8 would fail wherever the text goes (DuckDB, stdout)."""
    if not isinstance(value, str):
        return None
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _flag(value: Any) -> Optional[bool]:
    return value if isinstance(value, bool) else None


def _checked(value: Dict[str, Any], fields: Dict[str, Callable[[Any], Any]]) -> Dict[str, Any]:
    """`value` with each of `fields` that it has made of its type (or None) by its check."""
    checked = dict(value)
    for key, check in fields.items():
        if key in checked:
            checked[key] = check(checked[key])
    return checked


def _locals(values: Any) -> Optional[List[Dict[str, Any]]]:
    if not isinstance(values, list):
        return None
    named = (each for each in values if isinstance(each, dict) and isinstance(each.get("name"), str))
    return [_checked(each, {"name": _text, "repr": _text}) for each in named]


def _frames(frames: Any) -> List[Dict[str, Any]]:
    if not isinstance(frames, list):
        return []
    return [_checked(frame, _FRAME_FIELDS) for frame in frames if isinstance(frame, dict)]


_FRAME_FIELDS: Dict[str, Callable[[Any], Any]] = {
    "name": _text, "filename": _text, "module": _text, "short_filename": _text, "line": _integer,
    "locals": _locals,
}  # fmt: skip
_THREAD_FIELDS: Dict[str, Callable[[Any], Any]] = {
    "pid": _integer, "thread_id": _integer, "os_thread_id": _integer, "thread_name": _text, "active": _flag,
    "owns_gil": lambda value: value is True, "frames": _frames,
}  # fmt: skip


def _thread(thread: Dict[str, Any]) -> Dict[str, Any]:
    """One of py-spy's threads with each field py-spy documents of its type, or None (`owns_gil`
    True or False), and its frames likewise; a thread as py-spy prints it is left as it is."""
    return _checked(thread, _THREAD_FIELDS)


_WITHOUT_NATIVE = "without --native, `probing PID backtrace` reads the Python stacks through the agent"


def _dump_failed(pid: int, stderr: str, native: bool) -> ProbingError:
    """py-spy's failure in one sentence and what to do, rather than its Rust backtrace."""
    # py-spy prints "Error: <what>", then (with RUST_BACKTRACE) "Stack backtrace:" and frames.
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = next((line[len("Error:") :].strip() for line in lines if line.startswith("Error:")), None)
    said = said or (lines[0] if lines else "it failed without saying why")
    if len(said) > _MAX_SAID:
        said = said[: _MAX_SAID - 3] + "..."
    if "Permission denied" in stderr or "Operation not permitted" in stderr:
        return PermissionDenied(f"py-spy is not allowed to read PID {pid}: {said}")
    if "Failed to find a python interpreter" in said:
        return ProbingError(
            f"py-spy could not read the stacks of PID {pid}: it did not find the Python interpreter "
            f"in the process's memory (py-spy: {said}); it fails this way on very deep stacks "
            "(thousands of frames) and on interpreters it does not know",
            hint=_WITHOUT_NATIVE
            if native
            else "the agent still answers: drop --no-attach, or raise --timeout",
        )
    return ProbingError(
        f"py-spy could not read the stacks of PID {pid}: {said}",
        hint=_WITHOUT_NATIVE if native else "`probing -v ...` shows the py-spy command that was run",
    )


def _function_name(name: str) -> str:
    # py-spy shows qualified names (Thread.run); python.backtrace keeps co_name, as the agent does.
    return name.rsplit(".", 1)[-1] if "(" not in name else name


def describe_frame(frame: Dict[str, Any]) -> str:
    return f"{frame.get('name')} ({frame.get('short_filename') or frame.get('filename')}:{frame.get('line')})"


def _is_dummy(name: str) -> bool:
    number = name[len("Dummy-") :]
    return name.startswith("Dummy-") and number.isascii() and number.isdigit()


# The attach helper's thread starts in this script (native/helper.c runs it from the package's
# directory): a thread whose outermost frame is its code is that thread, even when it has ended,
# and so has no OS name left to tell, by the time its py-spy dump is read.
HELPER_SCRIPT = "/probing/bootstrap/attach.py"
# Likewise every agent thread's outermost frame is AgentThread._bootstrap (agent/threads.py): a
# connection's thread, read by py-spy as its client gave up and gone before its OS name was read,
# showed in a job's backtrace as the job's (3.15, the suite under load).
AGENT_THREAD_SCRIPT = "/probing/agent/threads.py"


def is_agent_thread(thread: Dict[str, Any]) -> bool:
    """The agent's threads, and the attach helper's thread (native frames only, in our library).
    Either is told first by its outermost frame, which is there even when the thread has ended.

    Agent threads are not threading's (agent/threads.py), so py-spy has no name for them: their
    OS name tells them (each names itself probing-..., the helper's thread probing-attach, then
    probing-agent). A thread threading knows is decided by its threading name alone: a thread a
    job started from an eval has the eval thread's OS name until it renames itself (3.14 does).
    But "Dummy-N", threading's name for a thread it did not start, is told by the OS name too:
    code run in an agent thread may make threading name it so (threading.current_thread()), and
    py-spy showed such a thread holding the GIL while the agent answered, taken for the job's."""
    frames = thread.get("frames") or []
    outermost = frames[-1] if frames else None
    if isinstance(outermost, dict) and str(outermost.get("filename") or "").endswith(
        (HELPER_SCRIPT, AGENT_THREAD_SCRIPT)
    ):
        return True
    name = thread.get("thread_name")
    if name and not _is_dummy(str(name)):
        return str(name).startswith("probing-")
    tid = thread.get("os_thread_id")
    if isinstance(tid, int) and tid > 0:
        if (thread_name(tid) or "").startswith("probing-"):
            return True
    return any(str(frame.get("module") or "").endswith("libprobing-helper.so") for frame in frames)


def rows_from_dump(pid: int, threads: List[Dict[str, Any]]) -> List[BacktraceRow]:
    """python.backtrace rows, main thread first, the agent's own threads left out. `threads`:
    py-spy's, as it printed them or as `threads_of` checked them."""
    checked = [_thread(thread) for thread in threads if isinstance(thread, dict)]
    ordered = sorted(
        (thread for thread in checked if not is_agent_thread(thread)),
        key=lambda thread: (thread.get("os_thread_id") != pid, thread.get("os_thread_id") or 0),
    )
    rows = []
    for thread in ordered:
        native_id = thread.get("os_thread_id")
        name = thread.get("thread_name") or ("MainThread" if native_id == pid else f"Thread-{native_id}")
        for depth, frame in enumerate(thread.get("frames") or []):
            native = frame.get("module") is not None
            local_values = frame.get("locals")
            rows.append(
                backtrace_row(
                    pid=pid,
                    thread_id=thread.get("thread_id"),
                    native_id=native_id,
                    thread_name=name,
                    is_main=native_id == pid,
                    depth=depth,
                    func=frame.get("name") if native else _function_name(str(frame.get("name"))),
                    file=frame.get("module") if native else frame.get("filename"),
                    lineno=frame.get("line") or None,
                    frame_type="Native" if native else "Python",
                    locals=json_dumps({v["name"]: v.get("repr") for v in local_values})
                    if local_values
                    else None,
                    source="py-spy",
                )
            )
    return rows


def checked_gil(pid: int, threads: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """`threads` with py-spy's owns_gil kept only on a thread that keeps the GIL, which /proc
    shows (outside/gil.py): py-spy also sets it on a thread state with id 0 (a thread starting),
    on threads whose OS id it got wrong, and on a thread that has the GIL for a moment. Every
    thread py-spy flags has the GIL's thread id, and one of them at most holds it: the first that
    is a thread of the process is looked at, and the others keep the flag only if they are it.
    probing's own threads lose it unlooked at: they are nobody's culprit, and the one that loads
    the agent ends soon after, when its OS name can no longer tell whose it was."""
    looked: Optional[Tuple[int, bool]] = None  # (its OS id, whether it keeps the GIL)
    for thread in threads:
        if not thread.get("owns_gil"):
            continue
        tid = thread.get("os_thread_id")
        if is_agent_thread(thread):
            thread["owns_gil"] = False
            continue
        if looked is None and isinstance(tid, int) and live_thread(pid, tid) is not None:
            looked = (tid, keeps_the_gil(pid, tid))
        thread["owns_gil"] = looked == (tid, True)
    return threads


def threads_among(threads: List[Dict[str, Any]], among: Optional[FrozenSet[int]]) -> List[Dict[str, Any]]:
    """`threads` whose ids are among `among` (None: all): a look taken while an agent starts
    leaves out the thread the injection started, which is not the job's (reading its files, it
    may hold the GIL for a moment)."""
    if among is None:
        return threads
    return [
        thread for thread in threads if thread.get("os_thread_id") in among or not thread.get("os_thread_id")
    ]


def gil_holder(threads: List[Dict[str, Any]]) -> Optional[str]:
    for thread in (_thread(each) for each in threads if isinstance(each, dict)):
        if thread.get("owns_gil") and not is_agent_thread(thread):
            frames = [frame for frame in thread.get("frames") or [] if frame.get("module") is None]
            where = f" in {describe_frame(frames[0])}" if frames else ""
            return f"thread '{thread.get('thread_name') or thread.get('os_thread_id')}' holds the GIL{where}"
    return None


def look(pid: int, native: bool = False, timeout: float = OUTSIDE_FLOOR_S) -> OutsideView:
    threads = dump(pid, native, timeout)
    return OutsideView(rows_from_dump(pid, threads), gil_holder(threads), threads)
