"""python.asyncio_tasks: every pending asyncio task with its await chain, read from the agent's
thread without running anything on the job's event loops and without running the job's code.

Where the tasks are, by version (all of it read under the GIL, each container copied whole by
one C call, so that a loop adding or dropping a task meanwhile cannot be half seen):
- 3.8-3.11: `_asyncio._all_tasks`, a WeakSet: its `data` (a set of weak references) is copied
  with `list()`, never iterated in Python (WeakSet.__iter__ is Python code that the loop's
  thread could interleave with);
- 3.12-3.13: `_asyncio._scheduled_tasks` the same way, and `_asyncio._eager_tasks`, a set;
- 3.14+: native tasks live in per-thread C lists that only `_asyncio.all_tasks(loop)` reads (it
  stops the world and takes a reference to each, as it does for other threads' loops in a
  free-threaded build); the loops are found in their threads' frames (`run_forever`'s `self`).
  It asks `done()` and the loop of a task that is not exactly an asyncio.Task (a subclass's own
  method may run there: the one exception to "no code of the job", and only on 3.14+).
Tasks registered by the pure-Python asyncio (`asyncio.tasks._all_tasks` / `_scheduled_tasks`
where that is another set) are read as on 3.8.

A task's fields are read through the C descriptors of `_asyncio.Task` and `Future` (a subclass's
property of the same name is never asked), a pure-Python task's from its instance dict; a chain
is walked through `cr_await` / `gi_yieldfrom` / `ag_await`, and through the wrappers that hide
the next awaitable (an async generator's `asend`, `coroutine_wrapper`) by `gc.get_referents`, all
C getters. Chains and the number of tasks listed are bounded, and the work is paced (pacing.py).
"""

from __future__ import annotations

import gc
import os
import sys
import types
from types import FrameType
from typing import Any, Dict, List, Optional, Tuple

from .stacks import current_frames

# The most frames of one task's chain.
MAX_DEPTH = 64

CHAIN_TYPES = (types.CoroutineType, types.GeneratorType, types.AsyncGeneratorType)
_wrapper_types: Optional[Tuple[type, ...]] = None


def _hidden_awaitable_types() -> Tuple[type, ...]:
    """The C wrappers that stand between a coroutine and what it awaits without a getter for
    it: an async generator's asend/athrow awaitables and a coroutine's `__await__()`."""
    global _wrapper_types
    if _wrapper_types is None:

        async def generator() -> Any:
            yield None

        async def coroutine() -> None:
            pass

        agen = generator()
        made = coroutine()
        samples = (agen.asend(None), agen.athrow(GeneratorExit), made.__await__())
        wrappers = tuple(type(sample) for sample in samples)
        # Closed, each of them: 3.13+ warns on the job's stderr of an asend never awaited.
        for sample in samples:
            sample.close()
        made.close()
        _wrapper_types = wrappers
    return _wrapper_types


def _own_descriptor(cls: type, name: str) -> Any:
    for base in cls.__mro__:
        if name in base.__dict__:
            return base.__dict__[name]
    return None


_GETSET = type(type.__dict__["__dict__"])


def instance_dict(obj: Any) -> Dict[str, Any]:
    """An object's own attributes, through the interpreter's `__dict__` getter: no property or
    __getattr__ of the job's runs."""
    for base in type(obj).__mro__:
        descriptor: Any = base.__dict__.get("__dict__")
        if type(descriptor) is _GETSET:
            try:
                fields = descriptor.__get__(obj)
            except Exception:  # noqa: BLE001 - an object without a dict has no fields to read
                return {}
            return fields if type(fields) is dict else {}
    return {}


def stdlib_field(obj: Any, cls: Any, name: str) -> Any:
    """An attribute of an instance of one of asyncio's own classes (a gather's future, a
    TaskGroup). Exactly that class: plain attribute lookup, which is C (none of them defines
    __getattribute__), and works where a C base keeps the attributes but shows no __dict__.
    A subclass of the job's: its instance dict only."""
    if cls is not None and type(obj) is cls:
        return getattr(obj, name, None)
    return instance_dict(obj).get(name)


# Fields every asyncio future has (their C getters are _asyncio.Future's), and a task's own.
_FUTURE_FIELDS = ("_state", "_loop", "_callbacks", "_asyncio_awaited_by")
_TASK_FIELDS = ("_coro", "_fut_waiter", "get_name")


class Reader:
    """Fields of tasks and futures, through _asyncio's C descriptors where the object is one of
    its types, its instance dict otherwise (the pure-Python asyncio)."""

    def __init__(self, module: Any) -> None:
        task_type = getattr(module, "Task", None) if module is not None else None
        future_type = getattr(module, "Future", None) if module is not None else None
        self.task_type = task_type if isinstance(task_type, type) else None
        self.future_type = future_type if isinstance(future_type, type) else None
        self.getters: Dict[str, Tuple[type, Any]] = {}
        for owner, names in ((self.future_type, _FUTURE_FIELDS), (self.task_type, _TASK_FIELDS)):
            if owner is None:
                continue
            for name in names:
                descriptor = _own_descriptor(owner, name)
                if descriptor is not None:
                    self.getters[name] = (owner, descriptor)
        python_tasks = sys.modules.get("asyncio.tasks")
        python_futures = sys.modules.get("asyncio.futures")
        self.python_task = getattr(python_tasks, "_PyTask", None)
        self.python_future = getattr(python_futures, "_PyFuture", None)
        self.gathering = getattr(python_tasks, "_GatheringFuture", None)
        self.taskgroup = getattr(sys.modules.get("asyncio.taskgroups"), "TaskGroup", None)

    def is_task(self, obj: Any) -> bool:
        return is_a(obj, self.task_type) or is_a(obj, self.python_task)

    def is_future(self, obj: Any) -> bool:
        return is_a(obj, self.future_type) or is_a(obj, self.python_future)

    def field(self, obj: Any, name: str) -> Any:
        owner, getter = self.getters.get(name, (None, None))
        if getter is not None and is_a(obj, owner):
            try:
                return getter.__get__(obj, type(obj))
            except Exception:  # noqa: BLE001 - a half-built task: the field is unknown
                return None
        return instance_dict(obj).get(name)

    def name(self, task: Any) -> str:
        owner, getter = self.getters.get("get_name", (None, None))
        name = None
        if getter is not None and is_a(task, owner):
            try:
                name = getter(task)  # C: it formats a lazy "Task-N" itself
            except Exception:  # noqa: BLE001 - a half-built task: named by its address
                pass
        else:
            name = instance_dict(task).get("_name")
        return name if type(name) is str else f"Task-at-{id(task):x}"

    def pending(self, future: Any) -> bool:
        return bool(self.field(future, "_state") == "PENDING")

    def is_gather(self, future: Any) -> bool:
        return is_a(future, self.gathering)

    def children(self, future: Any) -> List[Any]:
        """The futures a gather waits for."""
        if not self.is_gather(future):
            return []
        children = stdlib_field(future, self.gathering, "_children")
        return list(children) if type(children) is list else []

    def group_owner(self, task: Any) -> Any:
        """The task that owns the TaskGroup `task` belongs to (its done-callback is the group's)."""
        if self.taskgroup is None:
            return None
        callbacks = self.field(task, "_callbacks")
        for entry in list(callbacks) if type(callbacks) is list else []:
            callback = entry[0] if type(entry) is tuple and entry else entry
            if type(callback) is types.MethodType and is_a(callback.__self__, self.taskgroup):
                return stdlib_field(callback.__self__, self.taskgroup, "_parent_task")
        return None


def is_a(obj: Any, cls: Any) -> bool:
    """isinstance by the type's MRO: an object's __class__ (a property it may define) is not asked."""
    return cls is not None and cls in type(obj).__mro__


def _weak_set_items(weak_set: Any) -> List[Any]:
    data = instance_dict(weak_set).get("data") if weak_set is not None else None
    if type(data) is not set:
        return []
    return [item for item in (ref() for ref in list(data)) if item is not None]


def _running_loops(exclude: Any) -> List[Any]:
    """The loops running in the process's threads: `self` of each BaseEventLoop.run_forever frame."""
    loops: Dict[int, Any] = {}
    for ident, innermost in current_frames().items():
        if ident in exclude:
            continue
        frame: Optional[FrameType] = innermost
        while frame is not None:
            code = frame.f_code
            if code.co_name == "run_forever" and code.co_filename.endswith(
                os.path.join("asyncio", "base_events.py")
            ):
                try:
                    loop = frame.f_locals["self"]  # 3.13+: a proxy that reads the frame's slot
                except Exception:  # noqa: BLE001 - a loop whose run_forever has no self
                    loop = None
                if loop is not None:
                    loops[id(loop)] = loop
            frame = frame.f_back
    return list(loops.values())


def all_tasks(module: Any, exclude: Any) -> List[Any]:
    """Every task the process has registered (done ones included), each once."""
    found: Dict[int, Any] = {}
    python_tasks = sys.modules.get("asyncio.tasks")
    sets = [getattr(module, "_all_tasks", None), getattr(module, "_scheduled_tasks", None)]
    sets += [getattr(python_tasks, "_all_tasks", None), getattr(python_tasks, "_scheduled_tasks", None)]
    for weak_set in sets:
        for task in _weak_set_items(weak_set):
            found[id(task)] = task
    for eager in (getattr(module, "_eager_tasks", None), getattr(python_tasks, "_eager_tasks", None)):
        if type(eager) is set:
            for task in list(eager):
                found[id(task)] = task
    per_loop = getattr(module, "all_tasks", None) if sys.version_info >= (3, 14) else None
    if per_loop is not None:
        for loop in _running_loops(exclude):
            try:
                tasks = per_loop(loop)
            except Exception:  # noqa: BLE001 - a set that changed size meanwhile: read next time
                continue
            for task in list(tasks):
                found[id(task)] = task
    return list(found.values())


def _next_awaitable(obj: Any) -> Tuple[Any, Any]:
    """(frame, what it awaits) of one link of a chain; (None, None) past its end."""
    kind = type(obj)
    if kind is types.CoroutineType:
        return obj.cr_frame, obj.cr_await
    if kind is types.GeneratorType:
        return obj.gi_frame, obj.gi_yieldfrom
    if kind is types.AsyncGeneratorType:
        return obj.ag_frame, obj.ag_await
    if kind in _hidden_awaitable_types():
        inner = [each for each in gc.get_referents(obj) if type(each) in CHAIN_TYPES]
        return None, inner[0] if inner else None
    return None, None  # a future's iterator: the task's _fut_waiter says what it is


def running(coro: Any) -> bool:
    kind = type(coro)
    flag = (
        "cr_running" if kind is types.CoroutineType else "gi_running" if kind is types.GeneratorType else ""
    )
    return bool(getattr(coro, flag, False)) if flag else False


def chain(coro: Any, thread_frame: Any) -> Tuple[List[Any], bool]:
    """A coroutine's frames, outermost first, and whether MAX_DEPTH cut them. A running one's are
    on its thread's stack (`thread_frame`, innermost): from there out to the coroutine's frame."""
    frames: List[Any] = []
    if thread_frame is not None and type(coro) is types.CoroutineType:
        own = coro.cr_frame
        frame = thread_frame
        while frame is not None and frame is not own and len(frames) < MAX_DEPTH:
            frames.append(frame)
            frame = frame.f_back
        if frame is own:
            frames.append(own)
            frames.reverse()
            return frames, False
        frames = []
    link: Any = coro
    links = 0
    while link is not None and links < MAX_DEPTH * 2:
        frame, link = _next_awaitable(link)
        links += 1
        if frame is not None:
            if len(frames) == MAX_DEPTH:
                return frames, True
            frames.append(frame)
    return frames, False
