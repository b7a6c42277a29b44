"""While an eval runs, the calls that would end (or replace) the job's process are refused in
the eval's own thread, unless the user forces them.

`raise SystemExit` in eval is caught like any exception; `os._exit(3)`, `os.abort()`,
`os.kill(os.getpid(), SIGKILL)` or an `os.execv` are not exceptions: they end the job at
once. For as long as at least one guarded eval thread runs, those functions of `os`, `posix`,
`signal` and `_thread` are replaced by wrappers that raise ProcessExitRefused in a guarded
thread and call the real function in every other thread, so the job's own threads keep their
exact behaviour. The wrappers go when the last guarded thread ends, and on detach.

Not guarded (docs/commands.md says so too): threads the eval code starts, ctypes or C
extensions calling exit() or abort(), a subprocess killing its parent, a crash in native
code, running out of memory, and references to the real functions taken before the eval ran
(`from os import _exit` in the job's own modules).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from typing import Any, Callable, Dict, List, Set, Tuple

from ...originals import allocate_lock, get_ident


class ProcessExitRefused(BaseException):
    """Raised in an eval that calls a process-ending function; a BaseException, so that the
    eval's own `except Exception` does not swallow it and carry on."""


# Idents of the threads whose process-ending calls are refused.
_guarded: Set[int] = set()
# (module, name, real function, our wrapper) for each installed wrapper.
_installed: List[Tuple[Any, str, Any, Any]] = []
_lock = allocate_lock()


def _targets_us(pid: int) -> bool:
    """Whether kill(pid, ...) reaches this process: itself, its group, or everyone."""
    if pid in (os.getpid(), 0, -1):
        return True
    return pid < -1 and -pid == os.getpgrp()


def _refusal(call: str) -> ProcessExitRefused:
    return ProcessExitRefused(
        f"{call} would end the job (PID {os.getpid()}); eval refuses process-ending calls "
        f"(`probing {os.getpid()} eval --force ...` allows them)"
    )


def _describe(name: str, args: Tuple[Any, ...]) -> str:
    return f"{name}({', '.join(repr(arg) for arg in args)})"


def _checks() -> Dict[Tuple[str, str], Callable[[Tuple[Any, ...]], bool]]:
    """For each guarded function: whether a call with these arguments ends the process."""

    def always(args: Tuple[Any, ...]) -> bool:
        return True

    def kill(args: Tuple[Any, ...]) -> bool:
        # Signal 0 only asks whether the process exists; any other signal to ourselves is
        # refused, handled or not: SIGINT's default handler ends most jobs too.
        return len(args) >= 2 and args[1] != 0 and isinstance(args[0], int) and _targets_us(args[0])

    def killpg(args: Tuple[Any, ...]) -> bool:
        return len(args) >= 2 and args[1] != 0 and args[0] in (0, os.getpgrp())

    def signal_self(args: Tuple[Any, ...]) -> bool:
        return bool(args) and args[-1] != 0

    return {
        ("os", "_exit"): always,
        ("os", "abort"): always,
        ("os", "execv"): always,
        ("os", "execve"): always,
        ("os", "kill"): kill,
        ("os", "killpg"): killpg,
        ("signal", "raise_signal"): signal_self,
        ("signal", "pthread_kill"): signal_self,
        ("_thread", "interrupt_main"): always,
    }


def _wrap(module_name: str, name: str, real: Any, ends_process: Callable[[Tuple[Any, ...]], bool]) -> Any:
    qualified = f"{module_name}.{name}"

    @functools.wraps(real)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        # Set membership under the GIL: no lock on the job's own path through here.
        if get_ident() in _guarded and ends_process(args):
            raise _refusal(_describe(qualified, args))
        return real(*args, **kwargs)

    guarded.__probing_real__ = real  # type: ignore[attr-defined]
    return guarded


def _install() -> None:
    modules = {"os": os, "signal": signal, "_thread": sys.modules.get("_thread")}
    posix = sys.modules.get(os.name)  # `import posix; posix._exit(3)` must not slip past
    for (module_name, name), ends_process in _checks().items():
        real = getattr(modules[module_name], name, None)
        if real is None:
            continue
        wrapper = _wrap(module_name, name, real, ends_process)
        places = [modules[module_name]]
        if module_name == "os" and posix is not None and getattr(posix, name, None) is real:
            places.append(posix)
        for module in places:
            setattr(module, name, wrapper)
            _installed.append((module, name, real, wrapper))


def _uninstall() -> None:
    for module, name, real, wrapper in reversed(_installed):
        # Someone (the job, or eval code on purpose) put their own function there since: theirs
        # stays. Ours left behind in their hands calls through once nothing is guarded.
        if getattr(module, name, None) is wrapper:
            setattr(module, name, real)
    _installed.clear()


def guard(ident: int) -> None:
    """Refuse process-ending calls in thread `ident` until `release(ident)`."""
    with _lock:
        if not _installed:
            _install()
        _guarded.add(ident)


def release(ident: int) -> None:
    with _lock:
        _guarded.discard(ident)
        if not _guarded:
            _uninstall()


def release_all() -> None:
    """Detach: every wrapper goes, whatever still runs."""
    with _lock:
        _guarded.clear()
        _uninstall()


def installed() -> bool:
    return bool(_installed)
