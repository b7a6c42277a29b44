"""Run a short helper program (py-spy) and collect what it prints, within a time limit.

The native front end (native/front/main.c) may have started py-spy already, for a job stuck
on its GIL, and handed its pipes over in PROBING_PYSPY: the Python CLI's `main` takes them at
once (`HandOverScope`), `handed_over` gives them to pyspy.dump, and `collect`
reads them as `run` reads its own.

`subprocess` is not used here: importing it (with selectors, signal and threading) costs
`probing PID backtrace` a few milliseconds on the path where a stuck job is read from outside,
where py-spy itself takes little more than ten. posix_spawn, two pipes and poll do the same.
"""

from __future__ import annotations

import contextvars
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


class HandedOver:
    """The py-spy dump of `target` that the native front end started, until a reading takes
    it (`child` is then None)."""

    __slots__ = ("target", "child")

    def __init__(self, target: int, child: Child) -> None:
        self.target = target
        self.child: Optional[Child] = child

    def release(self) -> None:
        """Nothing read it: its pipes closed, and py-spy (done printing, or killed) reaped."""
        child, self.child = self.child, None
        if child is None:
            return
        os.close(child.out_read)
        os.close(child.err_read)
        if child.status is not None:
            return
        try:
            reaped, _ = os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: the PID may be another's now
            return
        if reaped == 0:  # still ours, unreaped: the PID is py-spy's
            os.kill(child.pid, SIGKILL)
            os.waitpid(child.pid, 0)


# The hand-over of the command now running: set by `HandOverScope` for the
# length of `main` only (a context, not a global: CLI code keeps no module state).
_HANDED: contextvars.ContextVar[Optional[HandedOver]] = contextvars.ContextVar("probing_pyspy", default=None)


def _taken_from_environment() -> Optional[HandedOver]:
    """PROBING_PYSPY, removed from the environment (no program this CLI starts sees it), its
    pipes made close-on-exec (none inherits them). Anything that does not fit (descriptors
    that are not pipes, a process that is not our child) is closed and ignored."""
    text = os.environ.pop(HANDED_OVER, None)
    if text is None:
        return None
    try:
        target, pid, out_read, err_read = (int(part) for part in text.split(":"))
    except ValueError:
        return None
    pipes = [descriptor for descriptor in (out_read, err_read) if _is_pipe(descriptor)]
    handed = None
    if len(pipes) == 2 and out_read != err_read and pid > 0:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            handed = HandedOver(target, Child(pid, out_read, err_read, status if reaped == pid else None))
        except ChildProcessError:  # not ours: its pipes are not py-spy's
            handed = None
    for descriptor in pipes:
        if handed is None:
            os.close(descriptor)
        else:
            os.set_inheritable(descriptor, False)
    return handed


class HandOverScope:
    """`with HandOverScope():` around a whole command: the native front end's py-spy, taken
    from the environment at once for `handed_over`, and released at the end if nothing took
    it."""

    __slots__ = ("handed", "token")

    def __enter__(self) -> Optional[HandedOver]:
        self.handed = _taken_from_environment()
        self.token = _HANDED.set(self.handed)
        return self.handed

    def __exit__(self, *exception: object) -> None:
        _HANDED.reset(self.token)
        if self.handed is not None:
            self.handed.release()


def handed_over(target: int, usable: bool) -> Optional[Child]:
    """The py-spy dump of `target` that the native front end started (same arguments as
    pyspy.dump's without --native or --locals), if it did and `usable`; taken once. Its output
    is read exactly as that of a py-spy started here: untrusted. One for another target, or
    not usable, is released at once: its py-spy has nothing this command reads."""
    handed = _HANDED.get()
    if handed is None or handed.child is None:
        return None
    if not usable or handed.target != target:
        handed.release()
        return None
    child, handed.child = handed.child, None
    return child


class TooMuchOutput(Exception):
    """The program printed more than its cap on `stream` ("stdout" or "stderr"); it was killed."""

    def __init__(self, stream: str, cap: int) -> None:
        super().__init__(stream)
        self.stream = stream
        self.cap = cap


# What a program read from outside may print: py-spy's JSON of thousands of deep stacks stays
# far below it; a program that prints more is killed, not buffered without end.
MAX_STDOUT_BYTES = 256 << 20
MAX_STDERR_BYTES = 1 << 20


def collect(
    child: Child,
    timeout: float,
    name: str,
    max_stdout: int = MAX_STDOUT_BYTES,
    max_stderr: int = MAX_STDERR_BYTES,
) -> Tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of `child`, killed when it outlives `timeout` (TimedOut) or
    prints more than a stream's cap (TooMuchOutput); reaped, and its pipes closed, in every case."""
    pid, out_read, err_read = child.pid, child.out_read, child.err_read
    caps = {out_read: ("stdout", max_stdout), err_read: ("stderr", max_stderr)}
    chunks: Dict[int, List[bytes]] = {out_read: [], err_read: []}
    sizes = dict.fromkeys(caps, 0)
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
                stream, cap = caps[descriptor]
                # One byte past the cap is enough to know it was passed.
                data = os.read(descriptor, min(65536, cap + 1 - sizes[descriptor]))
                if not data:
                    poller.unregister(descriptor)
                    open_ends.discard(descriptor)
                    continue
                sizes[descriptor] += len(data)
                if sizes[descriptor] > cap:
                    if child.status is None:
                        os.kill(pid, SIGKILL)
                    raise TooMuchOutput(stream, cap)
                chunks[descriptor].append(data)
    finally:
        os.close(out_read)
        os.close(err_read)
        status = child.status if child.status is not None else os.waitpid(pid, 0)[1]
    code = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status >> 8
    return code, b"".join(chunks[out_read]), b"".join(chunks[err_read])
