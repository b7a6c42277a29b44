"""Whether another tracer (gdb, strace, a debugger) holds a process, and which. Never prints.

A thread has one tracer at a time: while gdb or strace holds the job, PTRACE_SEIZE fails with
EPERM even for root. That is no lack of permission, and saying "not allowed to ptrace" sent
users to ptrace_scope and capabilities instead of to the gdb they left open in another terminal.
"""

from __future__ import annotations

import os
import shlex
from typing import NamedTuple, Optional

from ..errors import TracedByAnother
from ..procfs import command_line, thread_name

# The tracer's command line is quoted in full up to this length: enough to recognise
# `gdb -p 1234` or `strace -f -p 1234 -o trace.txt`.
_COMMAND_CHARS = 120


class Tracer(NamedTuple):
    pid: int
    command: str  # its command line, shortened; its name when that cannot be read


def _tracer_pid(pid: int, tid: str) -> int:
    try:
        with open(f"/proc/{pid}/task/{tid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"TracerPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def describe(tracer_pid: int) -> Tracer:
    """The tracer with PID `tracer_pid`, named by its command line."""
    command = shlex.join(command_line(tracer_pid)) or thread_name(tracer_pid) or "unknown command"
    if len(command) > _COMMAND_CHARS:
        command = command[: _COMMAND_CHARS - 3] + "..."
    return Tracer(tracer_pid, command)


def tracer_of(pid: int) -> Optional[Tracer]:
    """The process tracing a thread of `pid` (its main thread first), or None when none is.

    `strace -p` holds one thread, gdb and `strace -f` every thread; either way the tracer named
    is the one in the way. /proc that cannot be read says nothing (None)."""
    try:
        tasks = sorted(os.listdir(f"/proc/{pid}/task"), key=lambda tid: tid != str(pid))
    except OSError:
        return None
    for tid in tasks:
        tracer = _tracer_pid(pid, tid)
        if tracer:
            return describe(tracer)
    return None


def traced_error(pid: int, tracer: Tracer) -> TracedByAnother:
    return TracedByAnother(
        f"PID {pid} is traced by PID {tracer.pid} ({tracer.command}): a process has one tracer at a "
        "time, and probing must be it for a moment to attach"
    )
