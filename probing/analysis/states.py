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
    from typing import Any, Callable, Dict, Optional, Sequence, Tuple

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


def in_library(path: str) -> bool:
    """Whether a frame of this file is the standard library's or torch's machinery of a wait
    (or of a collective), rather than the job's own code."""
    if any(part in path for part in TORCH_LIBRARY):
        return True
    return "/lib/python" in path and any(part in path for part in STANDARD_LIBRARY)


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


def _native_state(frames: Sequence[BacktraceRow]) -> str:
    native = []
    for frame in frames:
        if frame.get("frame_type") != "Native":
            break
        native.append(str(frame.get("func") or ""))
    # The interpreter's GIL wait sits a few frames above the condition variable it sleeps on.
    if any(name in ("take_gil", "PyEval_RestoreThread", "PyEval_AcquireThread") for name in native[:8]):
        return "waiting for the GIL"
    # An address py-spy could not name (inside libc's syscall stubs) says nothing: the first name does.
    named = next((name for name in native if name and not name.startswith("0x")), "")
    return next((meaning for names, meaning in NATIVE_CALLS if named in names), "in native code")


WRAPPERS = ("wrapper", "_wrapper", "inner", "_fn", "decorated", "wrapped")


def _library_state(python: Sequence[BacktraceRow]) -> Optional[str]:
    state = None
    previous: Optional[Tuple[str, str]] = None
    for frame in python[:16]:
        path = str(frame.get("file") or "").replace("\\", "/")
        func = str(frame.get("func") or "")
        if not in_library(path):
            break
        if path.endswith("torch/distributed/distributed_c10d.py") and func not in WRAPPERS:
            # The outermost collective call (all_reduce, barrier, all_gather_object), not the
            # logging wrapper around it. The rest of torch.distributed (torchrun's elastic
            # agent, its rendezvous) is named by what its innermost line does.
            state = f"in torch.distributed.{func}"
        for part, funcs, meaning in LIBRARY_CALLS:
            if part in path and (not funcs or func in funcs):
                state = meaning
                break
        # Event.wait is a `wait` of threading.py calling Condition.wait, another one.
        if previous == ("threading", "wait") and path.endswith("/threading.py") and func == "wait":
            state = "waiting on an Event"
        previous = ("threading" if path.endswith("/threading.py") else path, func)
    return state


def _with_state(line: str) -> str:
    """The innermost frame sits on a `with` line: a C call in its header has not returned.
    A bare name or attribute is a C context manager whose __enter__ blocks: a lock."""
    header = line[len("with ") : -1].split(" as ")[0].strip()
    if "open(" in header:
        return f"opening a file (`{line}`)"
    if "(" not in header:
        return f"blocked entering `{line}`"
    return f"in a call in `{line}`"


def _line_state(line: str) -> Optional[str]:
    if ".acquire(" in line:
        return "waiting in Lock.acquire"
    if line.startswith("with ") and line.endswith(":"):
        return _with_state(line)
    if "sleep(" in line:
        return "sleeping"
    sockets = (".recv(", ".recv_into(", ".accept(", ".select(", ".poll(", "select.select(")
    if any(call in line for call in sockets):
        return "waiting on socket I/O"
    if any(call in line for call in ("in sys.stdin", "input(", "sys.stdin.read")):
        return "reading standard input"
    if any(call in line for call in (".read(", ".readline(", ".readinto(")):
        return "reading a file or pipe"
    if " open(" in line or line.startswith("open("):
        return "opening a file"
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
            if str(innermost.get("func") or "") == "acquire":
                state = "waiting in Lock.acquire"
            else:
                state = _line_state(code_line(innermost).strip())
    if outside is not None and outside.get("owns_gil"):
        return f"holds the GIL, {state or 'in native code'}"
    return state or "running Python"
