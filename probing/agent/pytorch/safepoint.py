"""Reading a torch job's gradients and tensor values without racing its training thread.

The agent's threads hold the GIL while they read, but torch does most of its work without it:
the autograd engine assigns `param.grad` (a C++ smart pointer) and rebases `grad_fn` during
backward, and optimizers update state tensors in place, all with the GIL released. A read of
`param.grad` from the agent's thread while the engine replaces it copies a pointer that is being
freed: four clients querying `python.modules` segfaulted a training job within a minute. So
(docs/decisions.md, "What the agent may read"):

- From its own threads the agent reads the Python object graph and the metadata torch keeps in
  a tensor's fixed fields: shape, dtype, device, element counts, requires_grad, storage size.
- Gradients, `grad_fn` and every tensor *value* (norms, NaN checks, a 0-d optimizer state) are
  read in the training thread at a safe point: an optimizer step's pre-hook, when the backward
  pass is over and the update has not begun (`at_step`).
- A job that does not step within the wait (idle, hung, between epochs, no optimizer) is read
  from the agent's thread only while no thread of the job is inside autograd, an optimizer or
  gradient clipping, checked before and after the read (`while_quiet`); otherwise the caller
  leaves those values out and says why.

Hook dictionaries are edited with the same care: torch iterates the global optimizer hooks as a
live OrderedDict, so adding or removing one while the training thread is inside a step raises
"OrderedDict mutated during iteration" in the job. Edits go through `in_forward`, which makes
them in the training thread at its next module call (module hooks are iterated from a copy).
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any, Callable, List, Optional, Tuple, TypeVar

from ...originals import Event, allocate_lock, get_ident, monotonic
from ..gil import running_without_gil, why_unsafe
from ..imported import imported
from ..lifecycle import JOB_HOOKS, on_stop
from ..stacks import current_frames, thread_names

Result = TypeVar("Result")

# How long a table waits for the next optimizer step unless the request says otherwise.
DEFAULT_STEP_WAIT_S = 1.0
# How long installing the step hook waits for a module call to do it in the training thread.
INSTALL_WAIT_S = 1.0
# After that, how long an edit of the hooks waits for a moment no thread of the job is inside a
# step, looking every QUIET_POLL_S, before it is given up (in_forward).
QUIET_WAIT_S = 10.0
QUIET_POLL_S = 0.005
# Frames of these parts of torch mean the thread is changing gradients or optimizer state now.
_BUSY_PARTS = (
    os.sep + os.path.join("torch", "autograd") + os.sep,
    os.sep + os.path.join("torch", "optim") + os.sep,
    os.sep + os.path.join("torch", "nn", "utils", "clip_grad"),
    os.sep + os.path.join("torch", "_tensor.py"),
)


class NotAtSafePoint(Exception):
    """The values could not be read safely now; the message says why, for the table's note."""


class _Work:
    __slots__ = ("function", "state", "result", "error", "done")

    def __init__(self, function: Callable[[], Any]) -> None:
        self.function = function
        self.state = "pending"  # -> running -> done, or pending -> cancelled
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.done = Event()


class _StepGate:
    """One global optimizer step pre-hook, installed on first use and kept until detach; it
    returns at once unless work is pending (one truthiness test per step)."""

    def __init__(self) -> None:
        self.lock = allocate_lock()
        self.pending: List[_Work] = []
        self.handle: Any = None
        self.installing = False

    def hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.pending:
            return
        with self.lock:
            works, self.pending = self.pending, []
            for work in works:
                work.state = "running"
        for work in works:
            try:
                work.result = work.function()
            except Exception as error:  # noqa: BLE001 - never break the job's optimizer step
                work.error = error
            finally:
                work.state = "done"
                work.done.set()


_gate = _StepGate()


def _registrar(torch: Any) -> Optional[Callable[[Callable[..., None]], Any]]:
    optimizer_module = sys.modules.get("torch.optim.optimizer")
    return getattr(optimizer_module, "register_optimizer_step_pre_hook", None)


def in_forward(torch: Any, change: Callable[[], None], wait_s: float) -> bool:
    """Make `change` (an edit of torch's hook dictionaries) in the training thread at its next
    module call, or here once `wait_s` passed without one, at a moment no thread of the job is
    inside a step (`_when_quiet`). Returns whether it ran in the training thread."""
    register = getattr(getattr(torch.nn.modules, "module", None), "register_module_forward_pre_hook", None)
    if register is None:
        change()
        return False
    lock = allocate_lock()
    ran: List[bool] = []
    done = Event()
    handle: List[Any] = []

    def once() -> bool:
        with lock:
            if ran:
                return False
            ran.append(True)
        try:
            change()
        finally:
            done.set()
        return True

    def at_call(module: Any, inputs: Any) -> None:
        try:
            if once():
                handle[0].remove()  # module hooks run from a copy: removing ourselves is safe
        except Exception:  # noqa: BLE001 - never break the job's forward pass
            pass

    handle.append(register(at_call))
    if done.wait(wait_s):
        return True
    in_training_thread = not _when_quiet(once, done)
    done.wait()  # when the training thread took it after all, let it finish the change
    handle[0].remove()
    return in_training_thread


def _when_quiet(once: Callable[[], bool], done: Any) -> bool:
    """`once()` from this thread as soon as no thread of the job is inside autograd or an
    optimizer, unless the training thread's module call made the change first (`done`).

    No module call within the wait means the job is idle, or slow: a loaded machine can hold a
    training thread for seconds inside its optimizer step, where torch iterates the global
    optimizer hooks as a live OrderedDict (our own pre-hook runs inside that loop), and an edit
    from here then raised in the job. After QUIET_WAIT_S of a job always inside a step, the
    change is not made at all: a hook left in place costs a truthiness test a step, an edit in
    the middle of the loop the job itself."""
    deadline = monotonic() + QUIET_WAIT_S
    while not done.is_set():
        if busy_thread((get_ident(),)) is None:
            return once()
        if monotonic() >= deadline:
            done.set()  # the change is given up: its waiter must not wait for it
            return False
        done.wait(QUIET_POLL_S)
    return False


def _install_gate(torch: Any) -> None:
    """Install the step hook once. Raises NotAtSafePoint when this torch has no step hooks, or
    when the job called no module while it was being installed (it is not training now)."""
    register = _registrar(torch)
    if register is None:
        raise NotAtSafePoint("this torch has no optimizer step hooks (torch >= 2.0 has them)")
    with _gate.lock:
        if _gate.handle is not None or _gate.installing:
            return
        _gate.installing = True
    on_stop(stop, JOB_HOOKS)
    handles: List[Any] = []
    training = False
    try:
        training = in_forward(torch, lambda: handles.append(register(_gate.hook)), INSTALL_WAIT_S)
    finally:
        with _gate.lock:
            _gate.handle = handles[0] if handles else None
            _gate.installing = False
    if not training:
        raise NotAtSafePoint(f"the job called no module within {INSTALL_WAIT_S:g} s")


def at_step(torch: Any, function: Callable[[], Result], wait_s: float) -> Result:
    """`function()`, run in the training thread at its next optimizer step (before the update).

    Raises NotAtSafePoint when no step comes within `wait_s`; the exception of `function` when
    it raised."""
    _install_gate(torch)
    work = _Work(function)
    with _gate.lock:
        _gate.pending.append(work)
    if not work.done.wait(max(0.0, wait_s)):
        with _gate.lock:
            if work.state == "pending":
                work.state = "cancelled"
                _gate.pending = [other for other in _gate.pending if other is not work]
        if work.state == "cancelled":
            raise NotAtSafePoint(f"the job did not reach an optimizer step within {wait_s:g} s")
        work.done.wait()  # running in the training thread right now: it finishes within the step
    if work.error is not None:
        raise work.error
    return work.result  # type: ignore[no-any-return]


def busy_thread(own_threads: Any) -> Optional[str]:
    """'MainThread in torch/autograd/graph.py:_engine_run_backward' for the first thread of the
    job that is inside autograd, an optimizer or gradient clipping; None when none is."""
    names = thread_names()
    for ident, innermost in current_frames().items():
        if ident in own_threads:
            continue
        frame: Optional[FrameType] = innermost
        while frame is not None:
            filename = frame.f_code.co_filename
            if any(part in filename for part in _BUSY_PARTS):
                where = filename.rsplit(os.sep + "torch" + os.sep, 1)[-1]
                return f"{names.get(ident, ident)} in torch/{where}:{frame.f_code.co_name}"
            frame = frame.f_back
    return None


def while_quiet(own_threads: Any, function: Callable[[], Result]) -> Result:
    """`function()` from this thread, when no thread of the job is changing gradients or
    optimizer state before or after it; NotAtSafePoint otherwise. The check holds only under
    the GIL (no thread of the job enters a step while this one reads): a free-threaded job
    running without it is read at a step only."""
    if running_without_gil():
        raise NotAtSafePoint(why_unsafe("reading values between steps"))
    busy = busy_thread(own_threads)
    if busy is None:
        result = function()
        busy = busy_thread(own_threads)
        if busy is None:
            return result
    raise NotAtSafePoint(f"{busy} now")


def read_safely(
    torch: Any, own_threads: Any, function: Callable[[], Result], wait_s: float
) -> Tuple[Optional[Result], Optional[str]]:
    """(result, None) read at the next step or, when the job does not step, while it is quiet;
    (None, why) when neither was possible."""
    try:
        return at_step(torch, function, wait_s), None
    except NotAtSafePoint as not_stepping:
        try:
            return while_quiet(own_threads, function), None
        except NotAtSafePoint as busy:
            return None, f"{not_stepping}, and {busy}"


def stop(wait_s: float = 0.5) -> None:
    """Detach (a stop hook, at JOB_HOOKS): remove the step hook, in the training thread at its
    next module call if one comes soon (so no step is iterating the hooks meanwhile). Safe to
    call again."""
    with _gate.lock:
        handle, _gate.handle = _gate.handle, None
        works, _gate.pending = _gate.pending, []
        for work in works:
            work.state = "cancelled"
    if handle is None:
        return
    torch = imported("torch")
    if torch is None:
        handle.remove()
        return
    in_forward(torch, handle.remove, wait_s)


def _forget_after_fork() -> None:
    # A DataLoader worker forked mid-request: its copy of the lock may be held, and the work
    # it would run belongs to the parent's waiting thread.
    _gate.lock = allocate_lock()
    _gate.pending = []
    _gate.installing = False


os.register_at_fork(after_in_child=_forget_after_fork)
