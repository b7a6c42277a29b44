"""The agent's own light record of torch.distributed collectives, for jobs whose torch has no
Flight Recorder or runs with it switched off (TORCH_FR_BUFFER_SIZE=0).

Installed the first time python.collectives or python.process_groups is asked for: each
collective function of torch.distributed (both `torch.distributed.X` and
`torch.distributed.distributed_c10d.X`, so the library's own calls between them are seen too) is
replaced by a wrapper that notes the call's group, sequence number, op, tensor shapes and dtypes
and times, then calls the original with the same arguments and returns or raises what it does.
Only metadata is read (`.shape`, `.dtype`); tensor data never. Collectives issued from C++
(DDP's gradient buckets) pass no Python function and are not seen: the Flight Recorder sees them.

The sequence number is the process group's own count (`_get_sequence_number_for_group`), which
ranks share however late the recording began; it counts send/recv as well. A call already
waiting when the recording began (the hang that made someone ask) has no wrapper around it: it
is found on the thread's stack instead (`waiting_on_stacks`).

Bounded: the newest RING_ROWS calls are kept. `remove` puts the original functions back
(detach); a wrapper another library has wrapped again stays, and passes every call straight on.
"""

from __future__ import annotations

import collections
import functools
import inspect
import itertools
from types import FrameType
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from ...originals import allocate_lock, get_ident, local, wall_time
from ..lifecycle import JOB_HOOKS, on_fork_in_child, on_stop
from ..stacks import current_frames, thread_names

# Calls kept; the oldest go first.
RING_ROWS = 2000
# Tensors of one list argument whose shapes are noted.
LIST_TENSORS = 64

# op -> (parameters holding its input tensors, parameters holding its output tensors)
COLLECTIVE_PARAMETERS: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    "all_reduce": (("tensor",), ("tensor",)),
    "broadcast": (("tensor",), ("tensor",)),
    "reduce": (("tensor",), ("tensor",)),
    "all_gather": (("tensor",), ("tensor_list",)),
    "all_gather_into_tensor": (("input_tensor",), ("output_tensor",)),
    "reduce_scatter": (("input_list",), ("output",)),
    "reduce_scatter_tensor": (("input",), ("output",)),
    "all_to_all": (("input_tensor_list",), ("output_tensor_list",)),
    "all_to_all_single": (("input",), ("output",)),
    "gather": (("tensor",), ("gather_list",)),
    "scatter": (("scatter_list",), ("tensor",)),
    "barrier": ((), ()),
    "send": (("tensor",), ()),
    "recv": ((), ("tensor",)),
    "isend": (("tensor",), ()),
    "irecv": ((), ("tensor",)),
}
POINT_TO_POINT = frozenset(("send", "recv", "isend", "irecv"))

# torch.float32 -> Float: the names the Flight Recorder uses (c10::ScalarType), so that rows of
# either source compare across ranks.
SCALAR_TYPE_NAMES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
    "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
    "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble",
}  # fmt: skip


class Call:
    """One recorded call; its fields are the columns of python.collectives it fills. Tensors are
    noted as (shape, dtype) pairs, named only when read: the job's thread does the least."""

    __slots__ = ("pg_id", "pg_desc", "seq", "op", "inputs", "outputs", "state", "created",
                 "completed", "thread_name", "record_id", "thread_ident", "backend")  # fmt: skip

    def __init__(self, op: str, record_id: int, created: Optional[float]) -> None:
        self.op = op
        self.record_id = record_id
        self.pg_id: Optional[str] = None
        self.pg_desc: Optional[str] = None
        self.seq: Optional[int] = None
        self.inputs: List[Tuple[Any, Any]] = []
        self.outputs: List[Tuple[Any, Any]] = []
        self.state = "started"
        self.created = created
        self.completed: Optional[float] = None
        self.thread_name: Optional[str] = None
        self.thread_ident = 0
        self.backend: Optional[str] = None

    @property
    def is_p2p(self) -> bool:
        return self.op in POINT_TO_POINT

    def sizes(self, tensors: List[Tuple[Any, Any]]) -> List[List[int]]:
        return [[int(extent) for extent in shape] for shape, _ in tensors]

    def dtypes(self, tensors: List[Tuple[Any, Any]]) -> List[str]:
        return [dtype_name(dtype) for _, dtype in tensors]


def dtype_name(dtype: Any) -> str:
    text = str(dtype)
    text = text[6:] if text.startswith("torch.") else text
    return SCALAR_TYPE_NAMES.get(text, text)


def note_tensors(value: Any, into: List[Tuple[Any, Any]]) -> None:
    """(shape, dtype) of a tensor or of a list of tensors: metadata only."""
    items = value[:LIST_TENSORS] if isinstance(value, (list, tuple)) else (value,)
    for item in items:
        shape = getattr(item, "shape", None)
        dtype = getattr(item, "dtype", None)
        if shape is not None and dtype is not None:
            into.append((shape, dtype))


def group_of(c10d: Any, group: Any) -> Any:
    return c10d._get_default_group() if group is None else group


def backend_of(group: Any) -> Optional[str]:
    try:
        return str(group.name())  # the backend's name: gloo, nccl
    except Exception:  # noqa: BLE001
        return None


def describe_group(c10d: Any, group: Any) -> Tuple[Optional[str], Optional[str], Optional[int]]:
    """(pg_id, pg_desc, the sequence number the group's next operation will carry)."""
    group = group_of(c10d, group)
    pg_id = getattr(group, "group_name", None)
    desc = getattr(group, "group_desc", None)
    try:
        seq: Optional[int] = int(group._get_sequence_number_for_group()) + 1
    except Exception:  # noqa: BLE001 - a backend that keeps no count
        seq = None
    return (str(pg_id) if pg_id is not None else None), (str(desc) if desc is not None else None), seq


class Argument:
    """Where a parameter of a wrapped function sits: its position, or its keyword."""

    def __init__(self, function: Callable[..., Any], name: str) -> None:
        code = inspect.unwrap(function).__code__
        positional = code.co_varnames[: code.co_argcount]
        self.name = name
        self.position = positional.index(name) if name in positional else -1

    def value(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        if 0 <= self.position < len(args):
            return args[self.position]
        return kwargs.get(self.name)


class CollectiveRecorder:
    """The wrappers and the ring of calls they fill."""

    def __init__(self, c10d: Any, distributed: Any) -> None:
        self.c10d = c10d
        self.namespaces = [distributed, c10d]
        self.calls: Deque[Call] = collections.deque(maxlen=RING_ROWS)
        self.open_by_thread: Dict[int, Call] = {}
        # pg_id -> [last sequence number enqueued, last completed]
        self.last: Dict[str, List[Optional[int]]] = {}
        self.on = False
        self.record_ids = itertools.count()  # next() is atomic: job threads record at once
        self.nesting = local()
        self.originals: Dict[str, Callable[..., Any]] = {}
        self.wrappers: Dict[str, Callable[..., Any]] = {}
        self.codes: Dict[Any, str] = {}  # code object of an original -> op
        self.started_at: Optional[float] = None

    # --- installing and removing (agent thread) ---------------------------------------------------

    def install(self) -> None:
        """Wrap each function that can be wrapped; one that cannot (a torch whose function has
        another shape) is left as it is, and the others are recorded. Never raises."""
        for op in COLLECTIVE_PARAMETERS:
            original = getattr(self.c10d, op, None)
            if original is None or op in self.originals or not callable(original):
                continue
            try:
                code = inspect.unwrap(original).__code__
                wrapper = self.wrap(op, original)
            except Exception:  # noqa: BLE001 - not a plain Python function: not recorded
                continue
            self.originals[op] = original
            self.codes[code] = op
            self.wrappers[op] = wrapper
            for namespace in self.namespaces:
                if getattr(namespace, op, None) is original:
                    setattr(namespace, op, wrapper)
        self.started_at = wall_time()
        self.on = True

    def remove(self) -> int:
        """Put the originals back where a wrapper of ours still sits; returns how many."""
        self.on = False
        restored = 0
        for op, wrapper in self.wrappers.items():
            for namespace in self.namespaces:
                if getattr(namespace, op, None) is wrapper:
                    setattr(namespace, op, self.originals[op])
                    restored += 1
        return restored

    def wrap(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        inputs, outputs = COLLECTIVE_PARAMETERS[op]
        input_arguments = [Argument(original, name) for name in inputs]
        output_arguments = [Argument(original, name) for name in outputs]
        group_argument = Argument(original, "group")
        recorder = self

        @functools.wraps(original)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            nesting = recorder.nesting
            # Only the outermost call is one collective: send may call isend, and the *_object
            # functions (not wrapped themselves) are recorded as the all_gather or broadcast
            # they make through the module's globals.
            if not recorder.on or getattr(nesting, "inside", False):
                return original(*args, **kwargs)
            call = recorder.begin(op, args, kwargs, input_arguments, output_arguments, group_argument)
            nesting.inside = True
            try:
                result = original(*args, **kwargs)
            except BaseException:
                recorder.finish(call, "failed")
                raise
            finally:
                nesting.inside = False
            recorder.returned(call, result)
            return result

        return recorded

    # --- recording (the job's threads; nothing here may raise into the job) ----------------------

    def begin(self, op: str, args: Tuple[Any, ...], kwargs: Dict[str, Any], inputs: List[Argument],
              outputs: List[Argument], group: Argument) -> Optional[Call]:  # fmt: skip
        try:
            call = Call(op, next(self.record_ids), wall_time())
            process_group = group_of(self.c10d, group.value(args, kwargs))
            call.pg_id, call.pg_desc, call.seq = describe_group(self.c10d, process_group)
            call.backend = backend_of(process_group)
            for argument in inputs:
                note_tensors(argument.value(args, kwargs), call.inputs)
            for argument in outputs:
                note_tensors(argument.value(args, kwargs), call.outputs)
            call.thread_ident = get_ident()  # named when read: cheaper than here
            self.calls.append(call)
            self.open_by_thread[call.thread_ident] = call
            # The group's progress counts collectives; point-to-point calls have their own order.
            if call.pg_id is not None and call.seq is not None and not call.is_p2p:
                self.last.setdefault(call.pg_id, [None, None])[0] = call.seq
            return call
        except Exception:  # noqa: BLE001 - the job's call goes on unrecorded
            return None

    def returned(self, call: Optional[Call], result: Any) -> None:
        """A synchronous call returned: done. An async one returned a Work: done when it is."""
        if call is None:
            return
        try:
            self.open_by_thread.pop(call.thread_ident, None)
            if result is None or not hasattr(result, "get_future"):
                self.finish(call, "completed")
                return
            call.state = "scheduled"  # until its future says it is done
            # gloo's future is done when the collective is; NCCL's when the work is queued on
            # its stream, which is not completion (and its callbacks run on CUDA streams).
            if call.backend == "gloo":
                result.get_future().add_done_callback(lambda _: self.finish(call, "completed"))
        except Exception:  # noqa: BLE001 - a Work without a future: its end stays unknown
            pass

    def finish(self, call: Optional[Call], state: str) -> None:
        if call is None:
            return
        try:
            self.open_by_thread.pop(call.thread_ident, None)
            call.state = state
            call.completed = wall_time()
            if state == "completed" and call.pg_id is not None and call.seq is not None and not call.is_p2p:
                last = self.last.setdefault(call.pg_id, [None, None])
                if last[1] is None or call.seq > last[1]:
                    last[1] = call.seq
        except Exception:  # noqa: BLE001 - from a torch callback: it must not fail
            pass

    # --- reading (agent thread) -------------------------------------------------------------------

    def recorded_calls(self) -> List[Call]:
        calls = list(self.calls)
        names = thread_names()
        for call in calls:
            if call.thread_name is None:
                call.thread_name = names.get(call.thread_ident)
        return calls

    def waiting_on_stacks(self, own_threads: Any) -> List[Call]:
        """Calls into a collective function that threads are in now and no wrapper saw begin
        (they began before the recording): found by their frames, read like the wrappers read."""
        found = []
        for ident, innermost in current_frames().items():
            if ident in own_threads or ident in self.open_by_thread:
                continue
            frame: Optional[FrameType] = innermost
            outermost: Optional[Tuple[str, FrameType]] = None
            while frame is not None:
                op = self.codes.get(frame.f_code)
                if op is not None:
                    outermost = (op, frame)
                frame = frame.f_back
            if outermost is not None:
                call = self.call_from_frame(outermost[0], outermost[1], ident)
                if call is not None:
                    found.append(call)
        return found

    def call_from_frame(self, op: str, frame: FrameType, ident: int) -> Optional[Call]:
        try:
            local = frame.f_locals
            call = Call(op, -1, None)  # when it began is unknown: before anyone looked
            inputs, outputs = COLLECTIVE_PARAMETERS[op]
            call.pg_id, call.pg_desc, seq = describe_group(self.c10d, local.get("group"))
            # The group counted the call when it was enqueued, before the wait it is in.
            call.seq = seq - 1 if seq is not None else None
            for name in inputs:
                note_tensors(local.get(name), call.inputs)
            for name in outputs:
                note_tensors(local.get(name), call.outputs)
            call.thread_name = thread_names().get(ident)
            call.thread_ident = ident
            return call
        except Exception:  # noqa: BLE001 - a frame that cannot show its locals
            return None


_lock = allocate_lock()
_recorder: Optional[CollectiveRecorder] = None


def recorder(c10d: Any, distributed: Any) -> CollectiveRecorder:
    """The process's one recorder, installed on first use."""
    global _recorder
    with _lock:
        if _recorder is None:
            _recorder = CollectiveRecorder(c10d, distributed)
            on_stop(stop, JOB_HOOKS)
            on_fork_in_child(_forget_lock_after_fork)
            _recorder.install()
        return _recorder


def current() -> Optional[CollectiveRecorder]:
    return _recorder


def stop() -> None:
    """Detach: the job's torch.distributed functions as they were."""
    global _recorder
    with _lock:
        if _recorder is not None:
            _recorder.remove()
            _recorder = None


def _forget_lock_after_fork() -> None:
    global _lock
    _lock = allocate_lock()
