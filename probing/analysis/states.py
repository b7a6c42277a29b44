"""What a thread is doing, read from its innermost frames: waiting on a lock, a queue, I/O,
sleeping, in native code, or running Python. Pure functions over python.backtrace rows.

A wait inside the standard library or torch's data loading passes through several library
frames (Event.wait -> Condition.wait -> lock.acquire; a DataLoader worker's queue get ->
Connection.poll -> selectors). The innermost of them says little ("waiting on socket I/O"
for a worker waiting for its next index), so the state is named after the outermost library
call of the chain that the thread's own code made.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs `probing PID backtrace` ~12 ms of start-up (docs/decisions.md)
    from typing import Any, Callable, Dict, Optional, Sequence

    from ..schema.rows import BacktraceRow

# Innermost native function names (from --native) and what they mean.
NATIVE_CALLS = (
    (("clock_nanosleep", "nanosleep", "usleep"), "sleeping"),
    (("pthread_cond_wait", "pthread_cond_timedwait", "sem_wait", "sem_timedwait", "__futex", "futex",
      "lll_lock", "pthread_mutex_lock"), "waiting on a lock (native)"),
    (("epoll_wait", "poll", "ppoll", "select", "pselect"), "waiting for I/O"),
    (("recv", "recvfrom", "recvmsg", "accept", "accept4", "read", "__libc_read"),
     "waiting to read (socket, pipe or file)"),
    (("wait4", "waitpid", "waitid"), "waiting for a child process"),
)  # fmt: skip

# Library files a wait passes through: the chain of innermost frames in them is read as one call.
# The standard library's only where it lives (lib/pythonX.Y): a job's own threading.py is not it.
STANDARD_LIBRARY = (
    "/threading.py", "/queue.py", "multiprocessing/", "/selectors.py", "/socket.py", "/ssl.py",
    "/subprocess.py", "concurrent/futures/",
)  # fmt: skip
TORCH_LIBRARY = ("torch/utils/data/", "torch/distributed/")
STANDARD_LIBRARY_ROOT = "/lib/python"


def in_library(path: str) -> bool:
    """Whether a frame of this file is the standard library's or torch's machinery of a wait
    (or of a collective), rather than the job's own code."""
    if any(part in path for part in TORCH_LIBRARY):
        return True
    return STANDARD_LIBRARY_ROOT in path and any(part in path for part in STANDARD_LIBRARY)


# (part of the file's path, function names or () for any) -> state; the outermost match wins.
LIBRARY_CALLS = (
    ("torch/utils/data/dataloader.py", ("_get_data", "_try_get_data"), "waiting for a DataLoader worker"),
    ("torch/utils/data/_utils/worker.py", ("_worker_loop",),
     "DataLoader worker waiting for work (an index from its queue)"),
    ("torch/utils/data/_utils/pin_memory.py", ("_pin_memory_loop",), "waiting for a batch to pin"),
    ("/threading.py", ("join", "_wait_for_tstate_lock"), "waiting in Thread.join"),
    ("/threading.py", ("start",), "waiting for a new thread to start"),
    ("/threading.py", ("acquire",), "waiting on a Semaphore"),
    ("/threading.py", ("wait", "wait_for"), "waiting on a Condition"),
    ("/queue.py", ("get",), "waiting on a queue (Queue.get)"),
    ("/queue.py", ("put",), "waiting on a queue (Queue.put)"),
    ("multiprocessing/queues.py", ("get",), "waiting on a multiprocessing queue"),
    ("multiprocessing/queues.py", ("_feed",), "waiting for items to send (multiprocessing queue feeder)"),
    ("multiprocessing/", ("_recv", "recv", "recv_bytes", "_recv_bytes", "poll", "_poll", "get", "wait"),
     "waiting for another process (multiprocessing)"),
    ("/subprocess.py", ("wait", "_wait", "_try_wait", "communicate", "_communicate", "run"),
     "waiting for a child process"),
    ("concurrent/futures/", ("result", "wait", "as_completed"), "waiting on a Future"),
    ("/selectors.py", (), "waiting on socket I/O"),
    ("/socket.py", (), "waiting on socket I/O"),
    ("/ssl.py", (), "waiting on socket I/O"),
)  # fmt: skip

# States that say the thread waits for something (another thread, a process, I/O, time):
# waking up in one of them again and again is polling, not progress (analysis/progress.py).
_WAITING_PREFIXES = (
    "waiting", "sleeping", "blocked", "reading", "opening", "in torch.distributed",
    "DataLoader worker waiting",
)  # fmt: skip


def is_waiting(state: str) -> bool:
    """Whether `state` (from thread_state, without its GIL prefix) is a wait."""
    return state.startswith(_WAITING_PREFIXES)


# The interpreter's GIL wait sits a few frames above the condition variable it sleeps on.
GIL_WAITS = ("take_gil", "PyEval_RestoreThread", "PyEval_AcquireThread")
GIL_WAIT_DEPTH = 8
# How py-spy shows a native frame it could not name (an address, inside libc's syscall stubs).
UNNAMED_ADDRESS = "0x"
# The states no rule names: a thread in native code, one running Python, and the prefix of the
# thread that holds the GIL when py-spy read the stacks from outside.
WAITING_FOR_THE_GIL = "waiting for the GIL"
IN_NATIVE_CODE = "in native code"
RUNNING_PYTHON = "running Python"
HOLDS_THE_GIL = "holds the GIL, "


def _native_state(frames: Sequence[BacktraceRow]) -> str:
    native = []
    for frame in frames:
        if frame.get("frame_type") != "Native":
            break
        native.append(str(frame.get("func") or ""))
    if any(name in GIL_WAITS for name in native[:GIL_WAIT_DEPTH]):
        return WAITING_FOR_THE_GIL
    # An address py-spy could not name (inside libc's syscall stubs) says nothing: the first name does.
    named = next((name for name in native if name and not name.startswith(UNNAMED_ADDRESS)), "")
    return next((meaning for names, meaning in NATIVE_CALLS if named in names), IN_NATIVE_CODE)


# The collective a thread is in: the outermost call of this file that is not a wrapper around
# one (all_reduce, barrier, all_gather_object; not the logging wrapper). The rest of
# torch.distributed (torchrun's elastic agent, its rendezvous) is named by what its innermost
# line does.
COLLECTIVES_FILE = "torch/distributed/distributed_c10d.py"
COLLECTIVE_STATE = "in torch.distributed."
WRAPPERS = ("wrapper", "_wrapper", "inner", "_fn", "decorated", "wrapped")
# Event.wait is a `wait` of threading.py calling Condition.wait, another one.
NESTED_WAIT = ("/threading.py", "wait", "waiting on an Event")
# The innermost frames read as one library call, at most.
LIBRARY_DEPTH = 16


def _library_state(python: Sequence[BacktraceRow]) -> Optional[str]:
    state = None
    nested_file, nested_func, nested_state = NESTED_WAIT
    previous_waited = False
    for frame in python[:LIBRARY_DEPTH]:
        path = str(frame.get("file") or "").replace("\\", "/")
        func = str(frame.get("func") or "")
        if not in_library(path):
            break
        if path.endswith(COLLECTIVES_FILE) and func not in WRAPPERS:
            state = COLLECTIVE_STATE + func
        for part, funcs, meaning in LIBRARY_CALLS:
            if part in path and (not funcs or func in funcs):
                state = meaning
                break
        waits = path.endswith(nested_file) and func == nested_func
        if previous_waited and waits:
            state = nested_state
        previous_waited = waits
    return state


# When no library call names the state: the innermost Python frame's function, then its line.
INNERMOST_CALLS = (("acquire",), "waiting in Lock.acquire")
# What the innermost line does, the first rule that matches: (how, parts, state), `how` being
# "in" (a part anywhere in the stripped line), "starts" (the line starts with one) or "with"
# (a `with ...:` line, named by WITH_HEADERS). The native front end reads this table as it is.
LINE_CALLS = (
    ("in", (".acquire(",), "waiting in Lock.acquire"),
    ("with", (), ""),
    ("in", ("sleep(",), "sleeping"),
    ("in", (".recv(", ".recv_into(", ".accept(", ".select(", ".poll(", "select.select("),
     "waiting on socket I/O"),
    ("in", ("in sys.stdin", "input(", "sys.stdin.read"), "reading standard input"),
    ("in", (".read(", ".readline(", ".readinto("), "reading a file or pipe"),
    ("in", (" open(",), "opening a file"),
    ("starts", ("open(",), "opening a file"),
)  # fmt: skip
# The innermost frame sits on a `with` line: a C call in its header (before any ` as `) has not
# returned; a bare name or attribute is a C context manager whose __enter__ blocks, a lock. The
# first part the header holds names it: (part, before the line, after it).
WITH_HEADERS = (
    ("open(", "opening a file (`", "`)"),
    ("(", "in a call in `", "`"),
    ("", "blocked entering `", "`"),
)


def _with_state(line: str) -> Optional[str]:
    if not (line.startswith("with ") and line.endswith(":")):
        return None
    header = line[len("with ") : -1].split(" as ")[0].strip()
    before, after = next((b, a) for part, b, a in WITH_HEADERS if part in header)
    return f"{before}{line}{after}"


def _line_state(line: str) -> Optional[str]:
    for how, parts, meaning in LINE_CALLS:
        if how == "with":
            state = _with_state(line)
            if state is not None:
                return state
        elif any(line.startswith(part) if how == "starts" else part in line for part in parts):
            return meaning
    return None


def thread_state(
    frames: Sequence[BacktraceRow],
    code_line: Callable[[BacktraceRow], str],
    outside: Optional[Dict[str, Any]] = None,
) -> str:
    """`frames` innermost first; `code_line(frame)` the source line of a Python frame;
    `outside`: py-spy's view of the thread (owns_gil, active), when the stacks came from it."""
    state = None
    if frames and frames[0].get("frame_type") == "Native":
        state = _native_state(frames)
    else:
        python = [frame for frame in frames if frame.get("frame_type") != "Native"]
        state = _library_state(python)
        if state is None and python:
            innermost = python[0]
            funcs, meaning = INNERMOST_CALLS
            if str(innermost.get("func") or "") in funcs:
                state = meaning
            else:
                state = _line_state(code_line(innermost).strip())
    if outside is not None and outside.get("owns_gil"):
        return HOLDS_THE_GIL + (state or IN_NATIVE_CODE)
    return state or RUNNING_PYTHON
