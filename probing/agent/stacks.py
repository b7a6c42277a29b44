"""Python stacks of every thread, read from inside: `sys._current_frames()` plus thread names."""

from __future__ import annotations

import json
import os
import sys
import threading
from types import FrameType
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from .requests import ErrorKind, RequestError

# How many locals of one frame are shown; the rest are counted.
MAX_LOCALS_PER_FRAME = 40


class ThreadStack:
    __slots__ = ("ident", "thread", "frame", "is_main")

    def __init__(
        self, ident: int, thread: Optional[threading.Thread], frame: FrameType, is_main: bool
    ) -> None:
        self.ident = ident
        self.thread = thread
        self.frame = frame
        self.is_main = is_main

    @property
    def name(self) -> str:
        return self.thread.name if self.thread is not None else f"Thread-{self.ident}"

    @property
    def native_id(self) -> Optional[int]:
        return getattr(self.thread, "native_id", None) if self.thread is not None else None

    def matches(self, selector: str) -> bool:
        """A thread is selected by its name, its Python ident or its native (OS) id."""
        return selector in (self.name, str(self.ident), str(self.native_id))

    def frames(self) -> Iterable[FrameType]:
        """Innermost first (depth 0 is where the thread is now)."""
        frame: Optional[FrameType] = self.frame
        while frame is not None:
            yield frame
            frame = frame.f_back


# Threads of the agent on their way out (the attach helper's, unwinding the import that ran
# it): ident -> native id. Their idents are no longer the agent's (a new thread, even one of
# the agent's, may get the same ident the moment they end), but while their task lives, a
# thread with that ident and no other native id is still them, and stays hidden.
leaving: Dict[int, int] = {}


def leave() -> None:
    """The calling thread is about to end: hide it until it has."""
    leaving[threading.get_ident()] = threading.get_native_id()


def _still_leaving(stack: ThreadStack) -> bool:
    native_id = leaving.get(stack.ident)
    return native_id is not None and stack.native_id in (None, native_id)


def thread_stacks(exclude: Set[int]) -> List[ThreadStack]:
    """Every Python thread but the agent's own: main thread first, then in creation order."""
    for ident, native_id in list(leaving.items()):
        if not os.path.exists(f"/proc/self/task/{native_id}"):
            leaving.pop(ident, None)
    frames = sys._current_frames()
    threads = {thread.ident: thread for thread in threading.enumerate()}
    main_ident = threading.main_thread().ident
    order = {ident: position for position, ident in enumerate(threads)}
    stacks = [
        ThreadStack(ident, threads.get(ident), frame, ident == main_ident)
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
    return json.dumps(shown)


def backtrace_rows(
    exclude: Set[int], selector: Optional[str], with_locals: bool, repr_limit: int
) -> Iterable[Tuple[Any, ...]]:
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
            yield (
                pid, stack.ident, native_id, name, stack.is_main, depth,
                code.co_name, code.co_filename, frame.f_lineno, "Python", local_values, "agent",
            )  # fmt: skip
