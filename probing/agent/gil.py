"""Whether the job's interpreter runs without a GIL (a free-threaded build, PEP 703), and the
refusal of what is safe only with one.

The agent reads other threads' frames from its own thread (`sys._current_frames()`, then
`f_back`, `f_lineno`, `f_locals`) and, when a torch job does not step, tensor metadata while
no thread is inside autograd (pytorch/safepoint.py `while_quiet`). Both are safe because the
GIL stops every other thread of the job from running Python while the agent reads: a frame
cannot be popped, freed or re-used under it. A free-threaded build running with the GIL off
gives no such guarantee: the frames of a running thread change while they are read, and a read
may follow a freed pointer. So those reads are refused, with a sentence that says why, rather
than made (docs/install.md, "Free-threaded builds"). What does not read another thread's
state (eval of the job's globals, tables the agent fills itself, records, memory totals) works.

A free-threaded build may run with the GIL on (PYTHON_GIL=1, or an extension module that does
not declare itself safe without it turns it back on at import): then every read is as safe as
on any build. So the GIL is asked about at each read, not once.
"""

from __future__ import annotations

import sys

from .requests import ErrorKind, RequestError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

# What a refusal says after naming the operation.
WITHOUT_GIL = (
    "this job runs a free-threaded CPython {version} with the GIL disabled, so other threads "
    "keep running while the agent would read them, and the read could follow freed memory"
)


def free_threaded_build(config_var: Optional[Callable[[str], Any]] = None) -> bool:
    """Whether the interpreter was built without a GIL (configure --disable-gil: the
    Py_GIL_DISABLED config variable, 3.13 and later). `config_var`: sysconfig.get_config_var,
    given by tests."""
    if config_var is None:
        if sys.version_info < (3, 13):
            return False  # no such build before 3.13; sysconfig is not worth importing
        import sysconfig

        config_var = sysconfig.get_config_var
    try:
        return bool(config_var("Py_GIL_DISABLED"))
    except Exception:  # noqa: BLE001 - a build whose configuration cannot be read has the GIL
        return False


def gil_enabled(is_enabled: Optional[Callable[[], Any]] = None) -> bool:
    """Whether the GIL is on now: `sys._is_gil_enabled()` (3.13+; always True on a build with
    a GIL), and True on an interpreter without that function. `is_enabled`: given by tests."""
    check = is_enabled if is_enabled is not None else getattr(sys, "_is_gil_enabled", None)
    if check is None:
        return True
    try:
        return bool(check())
    except Exception:  # noqa: BLE001 - cannot tell: as every build before 3.13
        return True


def running_without_gil(
    config_var: Optional[Callable[[str], Any]] = None, is_enabled: Optional[Callable[[], Any]] = None
) -> bool:
    """A free-threaded build with its GIL off now: reads of other threads are not safe."""
    return not gil_enabled(is_enabled) and free_threaded_build(config_var)


def why_unsafe(what: str) -> str:
    """The sentence that refuses `what` (an operation, e.g. "reading the threads' stacks")."""
    version = ".".join(str(part) for part in sys.version_info[:2])
    return f"{what} is refused: {WITHOUT_GIL.format(version=version)}"


def refuse_without_gil(what: str) -> None:
    """Raise the refusal of `what` (RequestError of kind NoGil) when the GIL is off now."""
    if running_without_gil():
        raise RequestError(ErrorKind.NO_GIL, why_unsafe(what))
