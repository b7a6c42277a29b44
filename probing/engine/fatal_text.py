"""What `faulthandler` wrote when a job died of a fatal signal, as python.backtrace rows.

A `.fatal` file is one header line (`#probing-fatal 1 {json}`) that the agent wrote when it
started, then whatever faulthandler wrote at the fault, without the GIL and without allocating:

    Fatal Python error: Segmentation fault

    Thread 0x00007f0338e756c0 (most recent call first):
      File "/job/data.py", line 5 in idle
      ...

    Current thread 0x00007f0339650b80 (most recent call first):
      File "/job/ext.py", line 8 in crash
      File "/job/train.py", line 9 in <module>

SIGTERM or SIGHUP with the default action (faulthandler.register, chained to that action) writes
the same thread sections with no "Fatal Python error" line before them; its "Current thread" is
the one the kernel handed the signal to.

The text is the job's (untrusted): lines that do not fit are left out, never guessed at.
Standard library only.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, List, Optional, Tuple

from ..schema.rows import backtrace_row

if TYPE_CHECKING:
    from ..schema.rows import BacktraceRow

# faulthandler names a thread by its pthread id, which is threading.get_ident(); it has no
# thread names. The faulting thread is "Current thread"; "Stack" is the only one (all_threads off).
_THREAD = re.compile(r"^(Current thread|Thread|Stack)(?: (0x[0-9a-fA-F]+))? \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')
_FATAL = re.compile(r"^Fatal Python error: (.*)$")
FAULTING_THREAD = "faulting thread"
SIGNALLED_THREAD = "signalled thread"
# Where the agent's code lives in an installed probing: its threads' frames are there.
AGENT_PATH = "/probing/agent/"
OTHER_THREAD = "thread"
# More frames than this in one thread, or threads in one file, are not a faulthandler's text
# (it writes at most 100 frames and 100 threads).
MAX_FRAMES = 1000
MAX_THREADS = 1000


def _agent_thread(stack: List[Tuple[str, Optional[int], str]]) -> bool:
    """Whether a thread is one of the agent's: the function it was started with (its outermost
    frame below threading's bootstrap) is in probing/agent/."""
    for file, _, _ in reversed(stack):
        if file.replace("\\", "/").endswith("/threading.py"):
            continue
        return AGENT_PATH in file.replace("\\", "/")
    return False


def parse_faulthandler(text: str, pid: Optional[int]) -> Tuple[Optional[str], List[BacktraceRow]]:
    """(the fatal error's message, python.backtrace rows) of faulthandler's text.

    The faulting thread is named FAULTING_THREAD (SIGNALLED_THREAD in a dump with no fatal
    error's line: a SIGTERM or SIGHUP's). faulthandler does not say which thread is
    the main one: a thread whose outermost frame is a module's top level (`<module>`) is taken
    for it, since threads that `threading` starts begin in `_bootstrap`.
    """
    message: Optional[str] = None
    threads: List[Tuple[Optional[int], bool, List[Tuple[str, Optional[int], str]]]] = []
    frames: Optional[List[Tuple[str, Optional[int], str]]] = None
    for line in text.splitlines():
        fatal = _FATAL.match(line)
        if fatal and message is None:
            message = fatal.group(1).strip()
            continue
        thread = _THREAD.match(line)
        if thread:
            if len(threads) >= MAX_THREADS:
                break
            frames = []
            ident = int(thread.group(2), 16) if thread.group(2) else None
            threads.append((ident, thread.group(1) != "Thread", frames))
            continue
        frame = _FRAME.match(line)
        if frame and frames is not None:
            if len(frames) < MAX_FRAMES:
                lineno = int(frame.group(2)) if frame.group(2).isdigit() else None
                frames.append((frame.group(1), lineno, frame.group(3)))
            continue
        if not line.startswith("  "):
            frames = None  # a blank line or another section ends the thread's frames
    rows: List[BacktraceRow] = []
    current_name = FAULTING_THREAD if message is not None else SIGNALLED_THREAD
    # faulthandler lists the agent's own threads too, which a live backtrace leaves out.
    threads = [thread for thread in threads if thread[1] or not _agent_thread(thread[2])]
    # The faulting thread first: it is what the reader came for (faulthandler writes it last).
    threads.sort(key=lambda thread: not thread[1])
    for ident, faulting, stack in threads:
        is_main = bool(stack) and stack[-1][2] == "<module>"
        for depth, (file, lineno, func) in enumerate(stack):
            rows.append(backtrace_row(
                pid=pid, thread_id=ident, native_id=None,
                thread_name=current_name if faulting else OTHER_THREAD,
                is_main=is_main, depth=depth, func=func, file=file, lineno=lineno,
                frame_type="Python", locals=None, source="faulthandler",
            ))  # fmt: skip
    return message, rows
