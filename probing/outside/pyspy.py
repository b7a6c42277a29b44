"""Stacks read from outside the process with py-spy: no agent, no cooperation, no GIL.

Used when the agent cannot answer (the GIL held forever, attach impossible), for native
frames (`--native`), and for descendants without an agent (`--children`). The rows are
python.backtrace rows with source = 'py-spy'.
"""

from __future__ import annotations

import os
import sys

from ..errors import PermissionDenied, ProbingError
from ..procfs import thread_name
from ..protocol.frames import json_dumps, json_loads
from . import spawn

# typing, json, shutil, pathlib and subprocess stay unimported: this module is on the path of
# `probing PID backtrace` when a stuck job is read from outside, timed against py-spy itself.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

# py-spy sometimes cannot read a process that is starting up; one retry settles it.
_ATTEMPTS = 2


class OutsideView:
    """The stacks of a process read with py-spy: python.backtrace rows, which thread holds the
    GIL ("thread 'x' holds the GIL in f (file.py:12)", if any), and py-spy's own threads (for
    the thread states)."""

    __slots__ = ("rows", "gil_holder", "threads")

    def __init__(self, rows: List[Dict[str, Any]], gil_holder: Optional[str], threads: List[Dict[str, Any]]):
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


def dump(pid: int, native: bool = False, timeout: float = 2.0, locals: bool = False) -> List[Dict[str, Any]]:
    """py-spy's JSON dump of every thread; raises ProbingError when it cannot read them."""
    binary = py_spy()
    if binary is None:
        raise ProbingError("py-spy is not installed", hint="pip install py-spy")
    command = [binary, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
    command += ["--locals"] if locals else []
    error: Optional[ProbingError] = None
    # Started by the native front end for a job stuck on its GIL, with these very arguments.
    handed = spawn.handed_over(pid, usable=not native and not locals)
    for _ in range(_ATTEMPTS):
        try:
            if handed is not None:
                child, handed = handed, None
                _, stdout, stderr = spawn.collect(child, timeout, binary)
            else:
                _, stdout, stderr = spawn.run(command, timeout)
        except spawn.TimedOut:
            error = ProbingError(
                f"py-spy did not read the stacks of PID {pid} within {timeout:g} s",
                hint=_WITHOUT_NATIVE if native else None,
            )
            continue
        except spawn.TooMuchOutput as too_much:
            raise ProbingError(
                f"py-spy printed more than {too_much.cap >> 20} MB on its {too_much.stream} reading PID {pid}"
            ) from None
        try:
            threads = json_loads(stdout.decode("utf-8", "replace"))
        except ValueError:
            error = _dump_failed(pid, stderr.decode("utf-8", "replace"), native)
            if isinstance(error, PermissionDenied):
                raise error from None
            continue
        if isinstance(threads, list) and all(isinstance(thread, dict) for thread in threads):
            return threads
        error = ProbingError(f"py-spy printed something other than a list of threads for PID {pid}")
    assert error is not None
    raise error


_WITHOUT_NATIVE = "without --native, `probing PID backtrace` reads the Python stacks through the agent"


def _dump_failed(pid: int, stderr: str, native: bool) -> ProbingError:
    """py-spy's failure in one sentence and what to do, rather than its Rust backtrace."""
    # py-spy prints "Error: <what>", then (with RUST_BACKTRACE) "Stack backtrace:" and frames.
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = next((line[len("Error:") :].strip() for line in lines if line.startswith("Error:")), None)
    said = said or (lines[0] if lines else "it failed without saying why")
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


def is_agent_thread(thread: Dict[str, Any]) -> bool:
    """The agent's threads, and the attach helper's thread (native frames only, in our library).

    The helper's thread has no `threading` name while it loads the agent, and without
    --native no frame of our library: its OS name tells it (the helper names itself
    probing-attach, then probing-agent, and the agent's threads inherit that)."""
    if str(thread.get("thread_name") or "").startswith("probing-"):
        return True
    tid = thread.get("os_thread_id")
    if isinstance(tid, int) and tid > 0:
        if (thread_name(tid) or "").startswith("probing-"):
            return True
    return any(
        str(frame.get("module") or "").endswith("libprobing-helper.so")
        for frame in thread.get("frames") or []
    )


def rows_from_dump(pid: int, threads: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """python.backtrace rows, main thread first, the agent's own threads left out."""
    ordered = sorted(
        (thread for thread in threads if not is_agent_thread(thread)),
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
                {
                    "pid": pid,
                    "thread_id": thread.get("thread_id"),
                    "native_id": native_id,
                    "thread_name": name,
                    "is_main": native_id == pid,
                    "depth": depth,
                    "func": frame.get("name") if native else _function_name(str(frame.get("name"))),
                    "file": frame.get("module") if native else frame.get("filename"),
                    "lineno": frame.get("line") or None,
                    "frame_type": "Native" if native else "Python",
                    "locals": json_dumps({v["name"]: v.get("repr") for v in local_values})
                    if local_values
                    else None,
                    "source": "py-spy",
                }
            )
    return rows


def gil_holder(threads: List[Dict[str, Any]]) -> Optional[str]:
    for thread in threads:
        if thread.get("owns_gil") and not is_agent_thread(thread):
            frames = [frame for frame in thread.get("frames") or [] if frame.get("module") is None]
            where = f" in {describe_frame(frames[0])}" if frames else ""
            return f"thread '{thread.get('thread_name') or thread.get('os_thread_id')}' holds the GIL{where}"
    return None


def look(pid: int, native: bool = False, timeout: float = 2.0) -> OutsideView:
    threads = dump(pid, native, timeout)
    return OutsideView(rows_from_dump(pid, threads), gil_holder(threads), threads)
