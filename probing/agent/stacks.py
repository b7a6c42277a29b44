"""Python stacks of every thread, read from inside: `sys._current_frames()` plus thread names."""

from __future__ import annotations

import _thread
import gc
import operator
import os
import sys
import threading
from types import FrameType
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from ..originals import get_ident, get_native_id, json_dumps
from ..schema.rows import backtrace_values
from .gil import refuse_without_gil
from .requests import ErrorKind, RequestError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..schema.rows import BacktraceValues

# How many locals of one frame are shown; the rest are counted.
MAX_LOCALS_PER_FRAME = 40

# sys._current_frames() can deadlock the whole process on CPython up to 3.11 (gh-106883, fixed in
# 3.12): it holds the interpreter's lock on its list of threads while it makes frame objects; an
# allocation there may start a collection, whose finalizers run Python code, which may let the GIL
# go; a thread that ends then takes the GIL and waits for that lock, and neither ever moves. Four
# clients running `backtrace` in a loop froze a training job for good within a minute here.
_GC_INSIDE_CURRENT_FRAMES = sys.implementation.name == "cpython" and sys.version_info < (3, 12)
_call = operator.methodcaller("__call__")


def current_frames() -> Dict[int, FrameType]:
    """sys._current_frames(), with gc paused around it where it could deadlock: disable, read,
    enable, called one after the other from C (map, unpacked in one instruction), so that no
    bytecode runs in between and no thread of the job can see gc off, or turn it on or off,
    meanwhile. A job that has gc off already keeps it off.

    Every read of other threads' frames starts here, so here a free-threaded job running with
    its GIL off is refused (agent/gil.py): walking frames that their threads change meanwhile
    could follow freed memory."""
    refuse_without_gil("reading the threads' frames")
    if not _GC_INSIDE_CURRENT_FRAMES or not gc.isenabled():
        return sys._current_frames()
    try:
        _, frames, _ = map(_call, (gc.disable, sys._current_frames, gc.enable))
    except BaseException:
        gc.enable()  # _current_frames failed (MemoryError): gc goes back on as it was
        raise
    return frames  # type: ignore[no-any-return]


def _fields_descriptor() -> Tuple[type, Any]:
    """The class that gives threads their instance dict, and the interpreter's own descriptor of
    that dict: a subclass that defines `__dict__`, `name` or `ident` as a property is not asked.
    Found through the MRO, so a Thread the job replaced by a subclass of its own before the
    agent loaded still leads to threading's."""
    interpreters = type(type.__dict__["__dict__"])  # getset_descriptor: C, not the job's Python
    for base in threading.Thread.__mro__:
        descriptor = base.__dict__.get("__dict__")
        if type(descriptor) is interpreters:
            return base, descriptor
    return threading.Thread, None


_THREAD_CLASS, _THREAD_FIELDS = _fields_descriptor()


def thread_fields(thread: Any) -> Dict[str, Any]:
    """A Thread's own fields (`_name`, `_ident`, `_native_id`, `_daemonic`), read without running
    any of the job's code: a Thread subclass may define `name` or `ident` as a property, and the
    job's code must not run in the agent (it could block, take a lock of the job's, or raise)."""
    if _THREAD_FIELDS is None or not issubclass(type(thread), _THREAD_CLASS):  # not isinstance: __class__
        return {}
    try:
        fields = _THREAD_FIELDS.__get__(thread)
    except Exception:  # noqa: BLE001 - a thread without its dict is known by its ident alone
        return {}
    return fields if type(fields) is dict else {}


def _main_ident_at_start() -> Optional[int]:
    main = getattr(threading, "_main_thread", None)
    ident = thread_fields(main).get("_ident") if main is not None else None
    return ident if type(ident) is int else None


# The main thread's ident, read when the agent loaded. gevent's patch_all() re-keys the main
# thread under its greenlet's id in `_active` (and in its `_ident`), which no frame of
# sys._current_frames() carries: a job patched after the attach must still have a main thread.
_MAIN_IDENT = _main_ident_at_start()


def main_thread_ident() -> Optional[int]:
    """The interpreter's main thread, by the ident sys._current_frames() uses."""
    runtime = getattr(_thread, "_get_main_thread_ident", None)  # 3.13+: the runtime's own
    if runtime is not None:
        try:
            return int(runtime())
        except Exception:  # noqa: BLE001 - a subinterpreter or a replaced _thread: as read at start
            pass
    return _MAIN_IDENT


def known_threads() -> Dict[int, Dict[str, Any]]:
    """ident -> fields of every thread the threading module knows, in the order they started
    (its `_active` dict, copied whole under the GIL: no lock of threading's is taken). The main
    thread is under the ident its frames have, even where gevent moved it (main_thread_ident)."""
    active = getattr(threading, "_active", None)
    if type(active) is not dict:
        return {}
    main = getattr(threading, "_main_thread", None)
    main_ident = main_thread_ident()
    known = {}
    for ident, thread in list(active.items()):
        if type(ident) is int:
            known[main_ident if thread is main and main_ident is not None else ident] = thread_fields(thread)
    return known


def thread_names() -> Dict[int, str]:
    """ident -> name of every thread the threading module knows."""
    names = {}
    for ident, fields in known_threads().items():
        name = fields.get("_name")
        if type(name) is str:
            names[ident] = name
    return names


def thread_name(thread: Any) -> Optional[str]:
    name = thread_fields(thread).get("_name")
    return name if type(name) is str else None


class ThreadStack:
    __slots__ = ("ident", "fields", "frame", "is_main")

    def __init__(self, ident: int, fields: Dict[str, Any], frame: FrameType, is_main: bool) -> None:
        self.ident = ident
        self.fields = fields  # empty for a thread that threading does not know
        self.frame = frame
        self.is_main = is_main

    @property
    def name(self) -> str:
        name = self.fields.get("_name")
        return name if type(name) is str else f"Thread-{self.ident}"

    @property
    def native_id(self) -> Optional[int]:
        native_id = self.fields.get("_native_id")
        return native_id if type(native_id) is int else None

    @property
    def daemon(self) -> Optional[bool]:
        daemon = self.fields.get("_daemonic")
        return daemon if type(daemon) is bool else None

    @property
    def alive(self) -> bool:
        """It has a frame, so it runs; threading marks one stopped on its way out (3.8-3.12)."""
        return self.fields.get("_is_stopped") is not True

    def matches(self, selector: str) -> bool:
        """A thread is selected by its name, its Python ident or its native (OS) id."""
        return selector in (self.name, str(self.ident), str(self.native_id))

    def frames(self) -> Iterable[FrameType]:
        """Innermost first (depth 0 is where the thread is now)."""
        frame: Optional[FrameType] = self.frame
        while frame is not None:
            yield frame
            frame = frame.f_back


def outermost_first(innermost: Optional[FrameType]) -> List[FrameType]:
    """A thread's frames from its entry point to where it is now."""
    frames = []
    while innermost is not None:
        frames.append(innermost)
        innermost = innermost.f_back
    frames.reverse()
    return frames


# Threads of the agent on their way out (the attach helper's, unwinding the import that ran
# it): ident -> native id. Their idents are no longer the agent's (a new thread, even one of
# the agent's, may get the same ident the moment they end), but while their task lives, a
# thread with that ident and no other native id is still them, and stays hidden.
leaving: Dict[int, int] = {}


def leave() -> None:
    """The calling thread is about to end: hide it until it has."""
    leaving[get_ident()] = get_native_id()


def _still_leaving(stack: ThreadStack) -> bool:
    native_id = leaving.get(stack.ident)
    return native_id is not None and stack.native_id in (None, native_id)


def thread_stacks(exclude: Set[int]) -> List[ThreadStack]:
    """Every Python thread but the agent's own: main thread first, then in creation order."""
    for ident, native_id in list(leaving.items()):
        if not os.path.exists(f"/proc/self/task/{native_id}"):
            leaving.pop(ident, None)
    frames = current_frames()
    threads = known_threads()
    main_ident = main_thread_ident()
    order = {ident: position for position, ident in enumerate(threads)}
    stacks = [
        ThreadStack(ident, threads.get(ident, {}), frame, ident == main_ident)
        for ident, frame in frames.items()
        if ident not in exclude
    ]
    stacks = [stack for stack in stacks if not _still_leaving(stack)]
    stacks.sort(key=lambda stack: (not stack.is_main, order.get(stack.ident, len(order)), stack.ident))
    return stacks


def select_threads(stacks: List[ThreadStack], selector: Optional[str]) -> List[ThreadStack]:
    if not selector:
        return stacks
    chosen = [stack for stack in stacks if stack.matches(selector)]
    if not chosen:
        names = ", ".join(f"{stack.name} ({stack.ident})" for stack in stacks)
        raise RequestError(ErrorKind.NOT_FOUND, f"no thread named or numbered {selector!r}; threads: {names}")
    return chosen


def _visible_locals(frame: FrameType) -> Iterable[Tuple[str, Any]]:
    names = frame.f_locals
    if frame.f_code.co_name != "<module>":
        return list(names.items())
    # A module frame's locals are its globals: show the data, not the imports and definitions.
    hidden = (type(os), type(_visible_locals), type)
    return [
        (name, value)
        for name, value in list(names.items())
        if not name.startswith("__") and not isinstance(value, hidden)
    ]


def frame_locals_json(frame: FrameType, render: Callable[[Any], str]) -> str:
    shown: Dict[str, str] = {}
    items = list(_visible_locals(frame))
    for name, value in items[:MAX_LOCALS_PER_FRAME]:
        shown[str(name)] = render(value)
    if len(items) > MAX_LOCALS_PER_FRAME:
        shown["..."] = f"{len(items) - MAX_LOCALS_PER_FRAME} more locals"
    return json_dumps(shown)


def backtrace_rows(
    exclude: Set[int], selector: Optional[str], with_locals: bool, repr_limit: int
) -> Iterable[BacktraceValues]:
    """python.backtrace rows, in table column order."""
    render: Optional[Callable[[Any], str]] = None
    if with_locals:
        from .reprs import BoundedRepr

        render = BoundedRepr(repr_limit).render
    pid = os.getpid()
    for stack in select_threads(thread_stacks(exclude), selector):
        name, native_id = stack.name, stack.native_id
        for depth, frame in enumerate(stack.frames()):
            code = frame.f_code
            # f_lineno is what traceback.extract_stack reports for the same frame.
            local_values = frame_locals_json(frame, render) if render is not None else None
            yield backtrace_values(
                pid=pid, thread_id=stack.ident, native_id=native_id, thread_name=name, is_main=stack.is_main,
                depth=depth, func=code.co_name, file=code.co_filename, lineno=frame.f_lineno,
                frame_type="Python", locals=local_values, source="agent",
            )  # fmt: skip
