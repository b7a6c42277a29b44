"""A rank at a glance: what its main thread is doing now and where, in one line, read from one
look at its stacks (python.backtrace rows). Pure functions; `probing PID ranks` shows one such
line per rank, so that the rank that is not where the others are stands out:

    in torch.distributed.all_reduce from train (train.py:64)
    sleeping in load_shard (train.py:38)
    holds the GIL, sleeping in hold_the_gil (train.py:44)

The state is thread_state's (analysis/states.py), the one reading of a stack that `backtrace`
and `hang` show too, followed by where the job's own code is: a rank that is not where the
others are differs in both. One look is not a verdict: a rank "running" now may be stuck in a
loop, and `hang` is what watches over time.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from .states import in_library, thread_state

if TYPE_CHECKING:
    from ..schema.rows import BacktraceRow as Frame


def main_thread(rows: List[Frame]) -> List[Frame]:
    """The frames of the main thread, innermost first; the first thread listed when none is
    marked main (a job whose main thread has exited, and whose work goes on in others)."""
    threads: Dict[Any, List[Frame]] = {}
    for row in rows:
        threads.setdefault((row.get("pid"), row.get("thread_id"), row.get("native_id")), []).append(row)
    if not threads:
        return []
    chosen = next((frames for frames in threads.values() if frames[0].get("is_main")), None)
    frames = chosen if chosen is not None else next(iter(threads.values()))
    return sorted(frames, key=lambda frame: frame.get("depth") or 0)


def _not_the_jobs(path: str) -> bool:
    """A file of torch, or of the standard library: the job's code is what calls into them."""
    if in_library(path) or "/torch/" in path:
        return True
    return "/lib/python" in path and "-packages/" not in path


def job_frame(frames: List[Frame]) -> Optional[Frame]:
    """The innermost frame of the job's own code: not torch's, not the standard library's,
    not a native frame. A thread whose frames are all theirs has none."""
    for frame in frames:
        if frame.get("frame_type") == "Native":
            continue
        if not _not_the_jobs(str(frame.get("file") or "").replace("\\", "/")):
            return frame
    return None


def where(frame: Frame) -> str:
    """`train (train.py:64)`: a frame as a person finds it in the job's source."""
    name = os.path.basename(str(frame.get("file") or "?"))
    lineno = frame.get("lineno")
    return f"{frame.get('func')} ({name}:{lineno if lineno is not None else '?'})"


def _other_gil_holder(
    rows: List[Frame], main: List[Frame], outside: Dict[Any, Dict[str, Any]]
) -> Optional[str]:
    """The name of a thread other than the main one seen holding the GIL (from outside)."""
    main_id = main[0].get("native_id") if main else None
    for row in rows:
        native_id = row.get("native_id")
        if native_id != main_id and (outside.get(native_id) or {}).get("owns_gil"):
            return str(row.get("thread_name"))
    return None


def glance(
    rows: List[Frame],
    code_line: Callable[[Frame], str],
    outside: Optional[Dict[Any, Dict[str, Any]]] = None,
) -> str:
    """What the process whose stacks `rows` are is doing, in one line. `code_line(frame)`: the
    source line of a frame; `outside`: py-spy's view of each thread by native id (owns_gil),
    when the stacks were read from outside."""
    frames = main_thread(rows)
    if not frames:
        return "no Python threads"
    views = outside or {}
    view = views.get(frames[0].get("native_id"))
    state = thread_state(frames, code_line, view)
    mine = job_frame(frames)
    if state == "running Python":
        # py-spy tells a thread asleep in the kernel (a C call that waits: DDP's backward
        # waiting for its gradients' all_reduce) from one that runs; the agent cannot.
        state = "waiting in a C call" if view is not None and view.get("active") is False else "running"
        innermost = next((frame for frame in frames if frame.get("frame_type") != "Native"), None)
        if innermost is not None and innermost is not mine:
            state += f" in {innermost.get('func')}"
    if mine is not None:
        # The job's frame is innermost: the state is of its own line. Otherwise it called into
        # a library that waits, and the call is named from where it was made.
        state += f" in {where(mine)}" if mine is frames[0] else f" from {where(mine)}"
    holder = _other_gil_holder(rows, frames, views)
    if holder is not None:
        state += f"; thread {holder!r} holds the GIL"
    return state
