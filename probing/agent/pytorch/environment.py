"""Torch features armed from the job's start: PROBING_TORCH_TRACE and PROBING_NAN.

`PROBING=1 PROBING_NAN=1 python train.py` checks for NaN/Inf from the first step, so the first
bad step is caught as it happens rather than found by a `nan on` typed after the loss went NaN
(when the weights often are NaN already and the cause is earlier than the checks). Both run at
interpreter start-up, before the job imports torch: once `import torch` has run, the tracer is
made, and every top-level module is hooked at its first call (hooks.discover_at_first_call).
Neither ever raises into the job; a problem is kept for `trace status` / `nan status`.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional

from . import tracer as torch_tracer

TRACE_ENVIRONMENT = "PROBING_TORCH_TRACE"
NAN_ENVIRONMENT = "PROBING_NAN"
# Values that leave a feature off, as an unset variable does (agent/__init__.py reads them too).
OFF_VALUES = ("", "0", "off", "false", "no")
ON_VALUES = ("1", "on", "true", "yes")


def parse_trace(value: str) -> Dict[str, Any]:
    """PROBING_TORCH_TRACE: `1` for the defaults, or `every=10,backward,depth=2,modules=GLOB`."""
    options: Dict[str, Any] = {
        "every": None,
        "backward": False,
        "modules": None,
        "depth": None,
        "capacity": None,
    }
    for item in value.split(","):
        key, _, argument = item.strip().partition("=")
        if key in ("",) + ON_VALUES:
            continue
        if key == "backward":
            options["backward"] = True
        elif key in ("every", "depth", "capacity") and argument.isdigit():
            options[key] = int(argument)
        elif key == "modules" and argument:
            options["modules"] = (options["modules"] or []) + [argument]
        else:
            raise ValueError(
                f"{TRACE_ENVIRONMENT}: cannot use {item!r}; e.g. every=10,backward,depth=2,modules=GLOB"
            )
    return options


def parse_nan(value: str) -> Optional[bool]:
    """PROBING_NAN: None (off) for 0/off/false/no, False for 1/on/true/yes (checks on), True for
    `stop` (checks on, and NonFiniteError raised at the first NaN/Inf, as `nan on --stop`)."""
    word = value.strip().lower()
    if word in OFF_VALUES:
        return None
    if word in ON_VALUES:
        return False
    if word == "stop":
        return True
    raise ValueError(f"{NAN_ENVIRONMENT}: cannot use {value.strip()!r}; 1 (checks on), stop, or 0 (off)")


def start_trace(value: str) -> None:
    """PROBING=1 PROBING_TORCH_TRACE=1: trace from the first step."""
    try:
        options = parse_trace(value)
    except ValueError as error:
        torch_tracer.note_start_error(str(error))
        return

    def begin() -> None:
        active = torch_tracer.tracer()
        active.configure_trace(
            options["every"], options["backward"], options["modules"], options["depth"], options["capacity"]
        )
        active.discover_at_first_call()

    _when_torch_imported(TRACE_ENVIRONMENT, begin)


def start_nan(value: str) -> None:
    """PROBING=1 PROBING_NAN=1: NaN/Inf checks from the first step (`stop`: with --stop)."""
    try:
        stop = parse_nan(value)
    except ValueError as error:
        torch_tracer.note_start_error(str(error))
        return
    if stop is None:
        return

    def begin() -> None:
        active = torch_tracer.tracer()
        active.configure_nan(True, stop)
        active.discover_at_first_call()

    _when_torch_imported(NAN_ENVIRONMENT, begin)


# What waits for `import torch` to finish: one finder for all of it, so that PROBING_TORCH_TRACE
# and PROBING_NAN together both start (a second finder would never see the import).
_after_torch: List[Callable[[], None]] = []


def _when_torch_imported(variable: str, begin: Callable[[], None]) -> None:
    def guarded() -> None:
        try:
            begin()
        except Exception as error:  # noqa: BLE001 - the job's import of torch must succeed
            torch_tracer.note_start_error(f"{variable}: {type(error).__name__}: {error}")

    if "torch.optim.optimizer" in sys.modules:
        guarded()
        return
    _after_torch.append(guarded)
    if len(_after_torch) == 1:
        sys.meta_path.insert(0, _AfterImport("torch", _run_after_torch))


def _run_after_torch() -> None:
    waiting = list(_after_torch)
    del _after_torch[:]
    for begin in waiting:
        begin()


class _AfterImport:
    """A meta path finder that lets `import NAME` run as usual, then calls `then` once."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None
        import importlib.util

        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module
        then = self.then

        def exec_then(module: Any) -> None:
            exec_module(module)
            # torch's code has all run; importlib marks the import done only once this returns,
            # and the agent takes a module marked under way for a half-made one (imported.py).
            spec = getattr(module, "__spec__", None)
            if spec is not None:
                spec._initializing = False
            then()

        loader.exec_module = exec_then
        return spec
