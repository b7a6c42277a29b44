"""Run a short helper program (py-spy) and collect what it prints, within a time limit.

The native front end (native/front/main.c) may have started py-spy already, for a job stuck
on its GIL, and handed its pipes over in PROBING_PYSPY: `handed_over` takes them, and
`collect` reads them as `run` reads its own.

`subprocess` is not used here: importing it (with selectors, signal and threading) costs
`probing PID backtrace` a few milliseconds on the path where a stuck job is read from outside,
where py-spy itself takes little more than ten. posix_spawn, two pipes and poll do the same.
"""

from __future__ import annotations

import os
import select
import stat
import time

# The module `signal` imports enum (milliseconds, for one constant); SIGKILL is 9 on Linux.
SIGKILL = 9

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

# "TARGET_PID:CHILD_PID:STDOUT_FD:STDERR_FD" of a py-spy dump the native front end started.
HANDED_OVER = "PROBING_PYSPY"


class TimedOut(Exception):
    """The program did not finish within its time; it was killed."""


def run(argv: List[str], timeout: float) -> Tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of `argv`; a status < 0 is the signal that ended it."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        pid = os.posix_spawn(
            argv[0],
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out_write, 1),
                (os.POSIX_SPAWN_DUP2, err_write, 2),
            ],
        )
    except BaseException:
        for descriptor in (out_read, out_write, err_read, err_write):
            os.close(descriptor)
        raise
    os.close(out_write)
    os.close(err_write)
    return collect(Child(pid, out_read, err_read), timeout, argv[0])


class Child:
    """A program started with its stdout and stderr on pipes; `status`: its wait status if it
    was reaped already."""

    __slots__ = ("pid", "out_read", "err_read", "status")

    def __init__(self, pid: int, out_read: int, err_read: int, status: Optional[int] = None) -> None:
        self.pid = pid
        self.out_read = out_read
        self.err_read = err_read
        self.status = status


def _is_pipe(descriptor: int) -> bool:
    try:
        return descriptor > 2 and stat.S_ISFIFO(os.fstat(descriptor).st_mode)
    except OSError:
        return False


def handed_over(target: int, usable: bool) -> Optional[Child]:
    """The py-spy dump of `target` that the native front end started (same arguments as
    pyspy.dump's without --native or --locals), if it did and `usable`; taken once. Its output
    is read exactly as that of a py-spy started here: untrusted. Anything that does not fit
    (another target, descriptors that are not pipes, a process that is not our child) is
    closed and ignored."""
    text = os.environ.pop(HANDED_OVER, None)
    if text is None:
        return None
    try:
        target_pid, pid, out_read, err_read = (int(part) for part in text.split(":"))
    except ValueError:
        return None
    pipes = [descriptor for descriptor in (out_read, err_read) if _is_pipe(descriptor)]
    child = None
    if usable and target_pid == target and len(pipes) == 2 and out_read != err_read and pid > 0:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            child = Child(pid, out_read, err_read, status if reaped == pid else None)
        except ChildProcessError:  # not ours: its pipes are not py-spy's
            child = None
    if child is None:
        for descriptor in pipes:
            os.close(descriptor)
    return child


def collect(child: Child, timeout: float, name: str) -> Tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of `child`, killed when it outlives `timeout`."""
    pid, out_read, err_read = child.pid, child.out_read, child.err_read
    chunks: Dict[int, List[bytes]] = {out_read: [], err_read: []}
    poller = select.poll()
    for descriptor in chunks:
        poller.register(descriptor, select.POLLIN)
    deadline = time.monotonic() + timeout
    open_ends = set(chunks)
    try:
        while open_ends:
            left = deadline - time.monotonic()
            if left <= 0:
                if child.status is None:
                    os.kill(pid, SIGKILL)
                raise TimedOut(name)
            for descriptor, _ in poller.poll(left * 1000):
                data = os.read(descriptor, 65536)
                if data:
                    chunks[descriptor].append(data)
                else:
                    poller.unregister(descriptor)
                    open_ends.discard(descriptor)
    finally:
        os.close(out_read)
        os.close(err_read)
        status = child.status if child.status is not None else os.waitpid(pid, 0)[1]
    code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8
    return code, b"".join(chunks[out_read]), b"".join(chunks[err_read])
