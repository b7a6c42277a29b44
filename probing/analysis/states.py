"""What a thread is doing, read from its innermost frames: waiting on a lock, a queue, I/O,
sleeping, in native code, or running Python. Pure functions over python.backtrace rows."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs `probing PID backtrace` ~12 ms of start-up (docs/decisions.md)
    from typing import Any, Callable, Dict, List, Optional

# Innermost native function names (from --native) and what they mean.
_NATIVE = (
    (("clock_nanosleep", "nanosleep", "usleep"), "sleeping"),
    (("pthread_cond_wait", "pthread_cond_timedwait", "sem_wait", "sem_timedwait", "__futex", "futex",
      "lll_lock", "pthread_mutex_lock"), "waiting on a lock (native)"),
    (("epoll_wait", "poll", "ppoll", "select", "pselect"), "waiting for I/O"),
    (("recv", "recvfrom", "recvmsg", "accept", "accept4", "read", "__libc_read"),
     "waiting to read (socket, pipe or file)"),
)  # fmt: skip


def _python_state(func: str, file: str, line: str) -> Optional[str]:
    name = os.path.basename(file or "")
    path = (file or "").replace("\\", "/")
    if "torch/distributed" in path:
        return f"in torch.distributed ({func})"
    if "multiprocessing/" in path and func in (
        "_recv",
        "recv",
        "recv_bytes",
        "_recv_bytes",
        "poll",
        "_poll",
        "get",
    ):
        return "waiting for another process (multiprocessing)"
    if name == "queue.py" and func in ("get", "put"):
        return f"waiting on a queue (Queue.{func})"
    if ".acquire(" in line or func == "acquire":
        return "waiting in Lock.acquire"
    if line.startswith("with ") and line.endswith(":"):
        # A C context manager's __enter__ leaves no Python frame: for a lock, this is acquire.
        return f"blocked entering `{line}`"
    if name == "threading.py" and func in ("join", "_wait_for_tstate_lock"):
        return "waiting in Thread.join"
    if "sleep(" in line:
        return "sleeping"
    if name in ("socket.py", "selectors.py", "ssl.py") or any(
        call in line for call in (".recv(", ".recv_into(", ".accept(", ".select(", ".poll(", "select.select(")
    ):
        return "waiting on socket I/O"
    if any(call in line for call in (".read(", ".readline(", "in sys.stdin", ".readinto(")):
        return "reading a file or pipe"
    return None


def thread_state(
    frames: List[Dict[str, Any]],
    code_line: Callable[[Dict[str, Any]], str],
    outside: Optional[Dict[str, Any]] = None,
) -> str:
    """`frames` innermost first; `code_line(frame)` the source line of a Python frame;
    `outside`: py-spy's view of the thread (owns_gil, active), when the stacks came from it."""
    state = None
    if frames and frames[0].get("frame_type") == "Native":
        function = str(frames[0].get("func") or "")
        state = next((meaning for names, meaning in _NATIVE if function in names), "in native code")
    else:
        python = [frame for frame in frames if frame.get("frame_type") != "Native"]
        # A DataLoader's main thread waits several frames down, in multiprocessing's queue code.
        waits_for_worker = any(
            "torch/utils/data/dataloader.py" in str(frame.get("file"))
            and frame.get("func") in ("_get_data", "_try_get_data")
            for frame in python[:8]
        )
        if waits_for_worker:
            state = "waiting for a DataLoader worker"
        elif python:
            innermost = python[0]
            state = _python_state(
                str(innermost.get("func") or ""), str(innermost.get("file") or ""), code_line(innermost)
            )
    if outside is not None and outside.get("owns_gil"):
        return f"holds the GIL, {state or 'in native code'}"
    return state or "running Python"
