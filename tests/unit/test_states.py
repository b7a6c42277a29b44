"""What a thread is doing, read from frame rows (analysis/states.py): no process."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

from probing.analysis.states import is_waiting, thread_state

LIB = "/usr/lib/python3.11"
TORCH = "/venv/lib/python3.11/site-packages/torch/utils/data"


def frames(*stack: Tuple[str, str, int], native: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """Rows innermost first: the native frames (names only), then the Python ones."""
    rows: List[Dict[str, Any]] = [
        {"func": name, "file": "libc.so.6", "lineno": None, "frame_type": "Native"} for name in native
    ]
    rows += [
        {"func": func, "file": file, "lineno": line, "frame_type": "Python"} for func, file, line in stack
    ]
    return rows


def state(rows: List[Dict[str, Any]], line: str = "", outside: Optional[Dict[str, Any]] = None) -> str:
    innermost = next((row for row in rows if row["frame_type"] == "Python"), None)
    return thread_state(rows, lambda frame: line if frame is innermost else "", outside)


USER = ("train", "/job/train.py", 12)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("with open(path) as handle:", "opening a file (`with open(path) as handle:`)"),
        ("with open(FIFO, 'rb') as fifo:", "opening a file (`with open(FIFO, 'rb') as fifo:`)"),
        ("with theirs:", "blocked entering `with theirs:`"),
        ("with self._lock:", "blocked entering `with self._lock:`"),
        ("with make_thing(x) as thing:", "in a call in `with make_thing(x) as thing:`"),
        ("lock.acquire()  # never returns", "waiting in Lock.acquire"),
        ("time.sleep(5)", "sleeping"),
        ("data = conn.recv(4096)", "waiting on socket I/O"),
        ("for line in sys.stdin:", "reading standard input"),
        ("chunk = handle.read(1 << 20)", "reading a file or pipe"),
        ("handle = open(path)", "opening a file"),
        ("total = sum(values)", "running Python"),
    ],
)
def test_the_innermost_line_says_what_a_c_call_is_doing(line: str, expected: str) -> None:
    assert state(frames(USER), line) == expected


def test_an_idle_dataloader_worker_waits_for_work_not_for_socket_io() -> None:
    """Its index queue's get polls a pipe through selectors: the outermost library call names it."""
    worker = frames(
        ("select", f"{LIB}/selectors.py", 415),
        ("wait", f"{LIB}/multiprocessing/connection.py", 947),
        ("_poll", f"{LIB}/multiprocessing/connection.py", 440),
        ("poll", f"{LIB}/multiprocessing/connection.py", 257),
        ("get", f"{LIB}/multiprocessing/queues.py", 113),
        ("_worker_loop", f"{TORCH}/_utils/worker.py", 334),
        ("run", f"{LIB}/multiprocessing/process.py", 108),
    )
    assert state(worker, "ready = selector.select(timeout)") == (
        "DataLoader worker waiting for work (an index from its queue)"
    )


def test_a_worker_inside_getitem_is_named_after_its_own_wait() -> None:
    stuck = frames(
        ("wait", f"{LIB}/threading.py", 327),
        ("wait", f"{LIB}/threading.py", 629),
        ("__getitem__", "/job/data.py", 15),
        ("_worker_loop", f"{TORCH}/_utils/worker.py", 349),
    )
    assert state(stuck, "waiter.acquire()") == "waiting on an Event"


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        ([("wait", f"{LIB}/threading.py", 327), ("get", f"{LIB}/queue.py", 180), USER],
         "waiting on a queue (Queue.get)"),
        ([("wait", f"{LIB}/threading.py", 331), USER], "waiting on a Condition"),
        ([("_wait_for_tstate_lock", f"{LIB}/threading.py", 1132), ("join", f"{LIB}/threading.py", 1112),
          USER],
         "waiting in Thread.join"),
        ([("wait", f"{LIB}/threading.py", 327), ("wait", f"{LIB}/threading.py", 629),
          ("start", f"{LIB}/threading.py", 969), USER], "waiting for a new thread to start"),
        ([("select", f"{LIB}/selectors.py", 415), ("wait", f"{LIB}/multiprocessing/connection.py", 947),
          ("get", f"{LIB}/multiprocessing/queues.py", 113), ("_try_get_data", f"{TORCH}/dataloader.py", 1133),
          ("_get_data", f"{TORCH}/dataloader.py", 1295), ("__next__", f"{TORCH}/dataloader.py", 631), USER],
         "waiting for a DataLoader worker"),
        ([("_try_wait", f"{LIB}/subprocess.py", 1959), ("wait", f"{LIB}/subprocess.py", 1209), USER],
         "waiting for a child process"),
        ([("wait", f"{LIB}/threading.py", 327), ("_feed", f"{LIB}/multiprocessing/queues.py", 231),
          ("run", f"{LIB}/threading.py", 982)], "waiting for items to send (multiprocessing queue feeder)"),
        ([("accept", f"{LIB}/socket.py", 294), USER], "waiting on socket I/O"),
        ([("barrier", "/venv/torch/distributed/distributed_c10d.py", 4100), USER],
         "in torch.distributed.barrier"),
        ([("all_reduce", "/venv/torch/distributed/distributed_c10d.py", 3252),
          ("wrapper", "/venv/torch/distributed/c10d_logger.py", 83), USER],
         "in torch.distributed.all_reduce"),
    ],
)  # fmt: skip
def test_waits_in_the_library_are_named_after_the_call_the_code_made(stack: Any, expected: str) -> None:
    assert state(frames(*stack), "waiter.acquire()") == expected
    assert is_waiting(expected)


def test_running_python_and_native_code_are_not_waits() -> None:
    assert not is_waiting("running Python") and not is_waiting("in native code")


@pytest.mark.parametrize(
    ("native", "expected"),
    [
        (["clock_nanosleep", "nanosleep", "sleep"], "sleeping"),
        (
            ["0x7f15e20a3f16", "pthread_cond_timedwait", "lock_PyThread_acquire_lock"],
            "waiting on a lock (native)",
        ),
        (
            ["0x7f15e20a3f16", "pthread_cond_timedwait", "take_gil", "PyEval_RestoreThread"],
            "waiting for the GIL",
        ),
        (["epoll_wait"], "waiting for I/O"),
        (["wait4", "os_waitpid"], "waiting for a child process"),
        (["matmul_kernel"], "in native code"),
    ],
)
def test_native_frames_name_the_wait(native: List[str], expected: str) -> None:
    assert state(frames(USER, native=native)) == expected


def test_a_thread_holding_the_gil_says_so_first() -> None:
    assert state(frames(USER), "libc.sleep(600)", {"owns_gil": True}) == "holds the GIL, sleeping"
    assert state(frames(USER), "compute()", {"owns_gil": True}) == "holds the GIL, in native code"
    assert state(frames(USER), "time.sleep(1)", {"owns_gil": False}) == "sleeping"
