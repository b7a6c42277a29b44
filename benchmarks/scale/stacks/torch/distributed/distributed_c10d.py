"""A stand-in for torch/distributed/distributed_c10d.py in the scale harness's ranks: its path ends
as torch's does, so that probing's state rules read a rank blocked here as "in
torch.distributed.all_reduce", as they read a rank blocked in torch's own all_reduce. It is not
torch: 1 024 ranks on 2 cores cannot run gloo, so the collective never completes, and the rank
blocks in a C call (a lock taken twice) with all_reduce as its innermost Python frame, where torch's
own all_reduce blocks in work.wait(). Loaded by path (rank.py), never as torch.distributed."""

import _thread
from typing import Any, Callable

_NEVER_RELEASED = _thread.allocate_lock()
_NEVER_RELEASED.acquire()


def _exception_logger(func: Callable[..., Any]) -> Callable[..., Any]:
    # torch wraps every collective in such a decorator: the state rules skip its `wrapper` frame.
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


@_exception_logger
def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> None:
    """Waits for peers that never come: the job is hung until the harness kills it."""
    _NEVER_RELEASED.acquire()
