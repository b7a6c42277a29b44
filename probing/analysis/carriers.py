"""Which threads carry a process: the part of analysis/progress.py's one definition of progress
that says whose progress is the process's (its docstring gives the rule): the threads named with
`--thread`, the main thread, and with it the threads it joins, or supervises while it only loops
on a wait. Also how the verdict names them."""

from __future__ import annotations

import fnmatch
import shlex
from typing import TYPE_CHECKING, Any, Dict, List, Sequence, Tuple

if TYPE_CHECKING:  # progress.py imports this module; its types are only named here
    from ..schema.rows import BacktraceRow
    from .progress import ThreadReport

Rows = List["BacktraceRow"]

# While the main thread is in one of these, the process is carried by its other threads.
_WAITS_FOR_THREADS = ("waiting in Thread.join", "waiting for a new thread to start")
# A main thread looping on one of these waits for another process (a DataLoader worker, a
# multiprocessing queue, a child, the other ranks), which its own other threads do not answer.
_WAITS_FOR_ANOTHER_PROCESS = (
    "waiting for a DataLoader worker", "DataLoader worker waiting", "waiting for another process",
    "waiting on a multiprocessing queue", "waiting for a child process", "in torch.distributed",
)  # fmt: skip


def base_state(thread: ThreadReport) -> str:
    return thread.state.split(", ", 1)[1] if thread.holds_gil else thread.state


def _waits_for_threads(thread: ThreadReport, frames: Rows) -> bool:
    # After the main script ends, the interpreter joins non-daemon threads in threading._shutdown.
    shutdown = any(
        frame["func"] == "_shutdown" and str(frame["file"]).endswith("threading.py") for frame in frames
    )
    return base_state(thread) in _WAITS_FOR_THREADS or shutdown


def named(name: str, patterns: Sequence[str]) -> bool:
    """Whether a thread of this name is one of `patterns` (names, or globs: 'worker-*')."""
    return any(name == pattern or fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def unmatched(patterns: Sequence[str], thread_names: Sequence[str]) -> List[str]:
    """The patterns (--thread) that name none of the threads `thread_names`."""
    return [pattern for pattern in patterns if not any(named(name, [pattern]) for name in thread_names)]


def thread_list(threads: List[ThreadReport]) -> str:
    """'MainThread', 'worker': threads as a verdict names them."""
    return ", ".join(repr(thread.name) for thread in threads)


def thread_options(thread_names: Sequence[str]) -> str:
    """`--thread NAME` for each name, as the user would type it."""
    return " ".join(f"--thread {shlex.quote(name)}" for name in thread_names)


def carriers_of(
    threads: List[ThreadReport], frames: Dict[Tuple[Any, Any], Rows], patterns: Sequence[str]
) -> Tuple[List[ThreadReport], str]:
    """The threads whose progress is the process's (analysis/progress.py says which), and why
    they are those, as the verdict says it ("" when the main thread carries it alone)."""
    missing = ""
    if patterns:
        wanted = thread_options(patterns)
        chosen = [thread for thread in threads if named(str(thread.name), patterns)]
        if chosen:
            return chosen, f"the threads named by {wanted} carry the process"
        # Not there (yet, or any more: the watchdog sees the job start and end): the rule decides.
        missing = f"no thread named by {wanted} was seen (threads: {thread_list(threads)}), so "
    main = next((thread for thread in threads if thread.is_main), None)
    others = [thread for thread in threads if not thread.is_main]
    if main is None:
        return threads, f"{missing}every thread carries it (no main thread was seen)"
    state = base_state(main)
    if others and _waits_for_threads(main, frames[(main.pid, main.thread_id)]):
        return (
            others,
            f"{missing}the other threads carry the process: the main thread only waits for them ({state})",
        )
    if others and main.activity == "looping" and not state.startswith(_WAITS_FOR_ANOTHER_PROCESS):
        why = f"the main thread only loops on a wait ({state}): the threads it supervises carry the process"
        return [main, *others], f"{missing}{why}"
    return [main], f"{missing}the main thread carries the process" if missing else ""
