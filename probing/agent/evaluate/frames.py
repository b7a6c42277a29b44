"""Which frame `eval --frame THREAD:FUNCTION` runs in: the innermost frame of that function in
that thread (or in any), its globals and a copy of its locals; and, when there is none, an
error that says where the threads are instead.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ..requests import ErrorKind, RequestError
from ..stacks import ThreadStack, thread_stacks
from . import framelocals

_OUTER_SHOWN, _INNER_SHOWN, _THREADS_SHOWN = 2, 4, 4  # what an error of --frame names of threads


def _describe_stack(stack: ThreadStack) -> str:
    """Where a thread is, in a line: importlib's frames left out, a module being imported named
    (a job importing torch is 60 frames deep), the middle of a deep stack counted."""
    names: List[str] = []
    for frame in stack.frames():
        module = dict.get(frame.f_globals, "__name__")  # not a get() of the job's own
        if not frame.f_code.co_filename.startswith("<frozen importlib"):
            imported = frame.f_code.co_name == "<module>" and type(module) is str and module != "__main__"
            names.insert(0, "import " + str(module)[:80] if imported else frame.f_code.co_name)
    if len(names) > _OUTER_SHOWN + _INNER_SHOWN + 1:
        names[_OUTER_SHOWN:-_INNER_SHOWN] = [f"({len(names) - _OUTER_SHOWN - _INNER_SHOWN} more)"]
    return " > ".join(names)


def frame_namespace(own_threads: Any, spec: str) -> Tuple[Dict[str, Any], Any]:
    """Globals of the innermost frame named by `THREAD:FUNCTION` (or `FUNCTION`), and a copy of
    its locals: the code's assignments never reach the frame (framelocals.py)."""
    thread_part, _, function = spec.rpartition(":")
    if not function:
        raise RequestError(ErrorKind.BAD_REQUEST, f"--frame {spec!r}: expected THREAD:FUNCTION")
    stacks = thread_stacks(own_threads)
    if thread_part:
        stacks = [stack for stack in stacks if stack.matches(thread_part)]
        if not stacks:
            raise RequestError(ErrorKind.NOT_FOUND, f"no thread named or numbered {thread_part!r}")
    for stack in stacks:  # the main thread comes first
        for frame in stack.frames():
            code = frame.f_code
            if function in (code.co_name, getattr(code, "co_qualname", None)):
                return frame.f_globals, framelocals.snapshot(frame)
    shown = [f"{stack.name}: {_describe_stack(stack)}" for stack in stacks[:_THREADS_SHOWN]]
    where = "; ".join(shown + [f"{len(stacks) - len(shown)} more threads"] * (len(stacks) > len(shown)))
    raise RequestError(ErrorKind.NOT_FOUND, f"no frame of function {function!r} is running ({where})")
