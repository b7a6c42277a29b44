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

From 3.14 on, faulthandler writes each thread's OS name after its id, as the job set it (any bytes
but NUL, up to 15 on Linux, a newline included, which splits the header over lines):

    Thread 0x00007f0338e756c0 [data loader] (most recent call first):

The name is read past, not shown: a row's thread_name says which thread faulted or was
signalled, and a job must not be able to forge that by naming a thread so.

SIGTERM or SIGHUP with the default action (faulthandler.register, chained to that action) writes
the same thread sections with no "Fatal Python error" line before them; its "Current thread" is
the one the kernel handed the signal to.

The text is the job's (untrusted): lines that do not fit are left out, never guessed at.
Standard library only.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterator, List, Optional, Tuple

from ..schema.rows import backtrace_row

if TYPE_CHECKING:
    from ..schema.rows import BacktraceRow

# faulthandler names a thread by its pthread id, which is threading.get_ident(), and from 3.14 on
# by its OS name in brackets too (greedy: a name may hold "]"; DOTALL: it may hold a newline).
# The faulting thread is "Current thread"; "Stack" is the only one (all_threads off).
_THREAD = re.compile(
    r"^(Current thread|Thread|Stack)(?: (0x[0-9a-fA-F]+))?(?: \[(.*)\])? \(most recent call first\):$",
    re.DOTALL,
)
# A header whose name a newline cut: the lines after it are joined to it until it is whole.
_NAMED_THREAD_START = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+ \[")
# faulthandler reads the name into 100 bytes; a "header" longer than that with its id and its
# tail is not one, and its lines are read as themselves.
MAX_HEADER_CHARS = 200
MAX_HEADER_LINES = 16
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


def _lines(text: str) -> Iterator[str]:
    """faulthandler's lines, each thread header that a newline in the thread's name cut over
    several lines joined into one. Split at "\\n" only, what faulthandler ends a line with: a name
    or a file name may hold any other character that str.splitlines would split at."""
    lines = text.split("\n")
    index = 0
    while index < len(lines):
        end = _header_end(lines, index)
        yield "\n".join(lines[index : end + 1])
        index = end + 1


def _header_end(lines: List[str], start: int) -> int:
    """The index of the last line of the thread header that starts at lines[start]: `start`
    itself unless that line opens a named header that only the lines after it complete."""
    if not _NAMED_THREAD_START.match(lines[start]) or _THREAD.match(lines[start]):
        return start
    joined = lines[start]
    for end in range(start + 1, min(start + MAX_HEADER_LINES, len(lines))):
        joined += "\n" + lines[end]
        if len(joined) > MAX_HEADER_CHARS:
            break
        if _THREAD.match(joined):
            return end
    return start


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
    for line in _lines(text):
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
