"""Tracing a live PyTorch job: per-module timings, optimizer steps and NaN/Inf checks.

Imported only when a client asks for a torch feature (or PROBING_TORCH_TRACE is set), and it
imports torch only when the job already has (`require_torch`). One tracer a process, made of:

- discovery.py: the job's models and optimizers, and their names;
- hooks.py: the forward hooks on the models' modules and the global optimizer step hooks;
- clock.py: step numbers, which steps are traced, the rows (CUDA durations from events);
- backward.py: the backward pass of each module, timed by autograd node hooks;
- nonfinite.py: the NaN/Inf checks and `NonFiniteError`.

This module turns them on and off (from the agent's thread, under the tracer's lock) and says
what they are doing (`trace status`).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional

from ...originals import RLock, allocate_lock, perf_counter
from ..lifecycle import JOB_HOOKS, on_stop
from ..ring import Ring
from . import safepoint
from .backward import BackwardWalk
from .clock import StepClock, Traced, trace_ring
from .discovery import NoTorch, require_torch
from .hooks import Hooks
from .nonfinite import NanChecks, NonFiniteError

__all__ = ["NoTorch", "NonFiniteError", "Tracer", "current", "require_torch", "tracer"]


class Tracer:
    """A process's torch tracer: its parts, switched on and off from the agent's thread."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.lock = RLock()
        self.clock = StepClock(torch, self.lock)
        self.nan = NanChecks(self.clock)
        sequence_nr: Optional[Callable[[], int]] = getattr(
            getattr(torch._C, "_autograd", None), "_get_sequence_nr", None
        )
        self.walk = BackwardWalk(self.clock, self.nan, sequence_nr)
        self.hooks = Hooks(self.clock, self.nan, self.walk)

    # What agent/tables.py reads to ship python.torch_trace and python.nan_events.

    @property
    def ring(self) -> Ring:
        return self.clock.ring

    @property
    def nan_ring(self) -> Ring:
        return self.nan.ring

    @property
    def pending_cuda(self) -> List[Any]:
        return self.clock.pending_cuda

    def resolve_cuda(self) -> None:
        self.clock.resolve_cuda()

    @property
    def own_threads(self) -> Any:
        return self.hooks.own_threads

    @own_threads.setter
    def own_threads(self, own_threads: Any) -> None:
        self.hooks.own_threads = own_threads

    # --- switches (agent thread) ---------------------------------------------------------------

    def configure_trace(
        self,
        every: Optional[int],
        backward: bool,
        patterns: Optional[List[str]],
        depth: Optional[int],
        capacity: Optional[int],
    ) -> None:
        clock, hooks = self.clock, self.hooks
        with self.lock:
            if backward and self.walk.sequence_nr is None:
                raise ValueError("--backward needs torch >= 2.0 (torch._C._autograd._get_sequence_nr)")
            clock.auto_every = every is None
            clock.every = every or 1
            clock.backward = backward
            if capacity and capacity != clock.ring.capacity:
                # The hooks hold codes of the old ring's dictionary: they go, and come back below.
                hooks.remove_module_hooks()
                clock.new_ring(capacity)
            if patterns != hooks.patterns or depth != hooks.depth:
                hooks.remove_module_hooks()
            hooks.patterns, hooks.depth = patterns, depth
            if not clock.trace_on:
                clock.begin_session()
            clock.trace_on = True
            clock.error = None
            if clock.auto_every:
                clock.call_cost = calibrate(self.torch)
            clock.refresh()
            self._install()

    def configure_nan(self, on: bool, stop: bool) -> None:
        clock = self.clock
        with self.lock:
            clock.nan_on = on
            self.nan.stop = stop and on
            if on:
                clock.error = None
                self.nan.step = -1
                self._install()
            clock.refresh()
            if not clock.trace_on and not clock.nan_on:
                self.uninstall()

    def trace_off(self) -> None:
        with self.lock:
            self.clock.trace_on = False
            self.clock.refresh()
            if not self.clock.nan_on:
                self.uninstall()

    def discover_at_first_call(self) -> None:
        on_stop(stop, JOB_HOOKS)
        self.hooks.discover_at_first_call()

    def _install(self) -> None:
        on_stop(stop, JOB_HOOKS)
        self.hooks.install()

    def uninstall(self) -> int:
        """Remove every hook this tracer added; returns how many. Safe to call again."""
        clock = self.clock
        with self.lock:
            removed = self.hooks.remove_all()
            clock.trace_on = clock.nan_on = clock.tracing_now = clock.watching = False
            self.nan.stop = False
            return removed

    def hook_count(self) -> int:
        return self.hooks.count()

    def is_hooked(self, module: Any) -> bool:
        traced = self.hooks.traced.get(id(module))
        return traced is not None and bool(traced.handles)

    def optimizer_name(self, optimizer: Any) -> Optional[str]:
        known = self.hooks.optimizers.get(optimizer)
        return known[0] if known is not None else None

    # --- status ----------------------------------------------------------------------------------

    def status(self) -> Dict[str, Any]:
        clock, nan, hooks = self.clock, self.nan, self.hooks
        with self.lock:
            roots = [name for name, ref in hooks.roots if ref() is not None]
            return {
                "trace": clock.trace_on,
                "nan": clock.nan_on,
                "stop_on_nan": nan.stop,
                "stopped_at_step": nan.stopped_at,
                "every": clock.every,
                "every_auto": clock.auto_every,
                "call_cost_us": round(clock.call_cost * 1e6, 2),
                "backward": clock.backward,
                "modules": hooks.patterns,
                "depth": hooks.depth,
                "models": roots,
                "hooked_modules": len(hooks.traced),
                "hooks": hooks.count(),
                "optimizers": sorted(name for name, _ in hooks.optimizers.values()),
                "step": clock.step,
                "rows": len(clock.ring),
                "capacity": clock.ring.capacity,
                "dropped_rows": clock.ring.dropped,
                "pending_cuda": len(clock.pending_cuda),
                "nan_events": nan.events,
                "rank": clock.rank,
                "error": clock.error or start_error,
                "notes": [hooks.discovery_note] if hooks.discovery_note else [],
            }


def calibrate(torch: Any) -> float:
    """Seconds one traced module call costs here: a hooked nn.Identity against a bare one, with
    a tracer of its own, so that the job's tracing goes on untouched meanwhile."""
    probe = torch.nn.Identity()
    data = torch.zeros(1)
    scratch = Tracer(torch)
    scratch.clock.ring = trace_ring(1000, "calibration")
    scratch.clock.tracing_now = scratch.clock.watching = True
    pre, post = scratch.hooks.hooks_for(Traced(probe, "calibration", 0, scratch.clock.ring, False), False)

    def run(calls: int) -> float:
        start = perf_counter()
        for _ in range(calls):
            probe(data)
        return perf_counter() - start

    bare = min(run(100) for _ in range(3))
    handles = [probe.register_forward_pre_hook(pre), probe.register_forward_hook(post)]
    try:
        hooked = min(run(100) for _ in range(3))
    finally:
        for handle in handles:
            handle.remove()
    return max(1e-6, (hooked - bare) / 100)


def stop() -> None:
    """Detach (a stop hook, at JOB_HOOKS): the safe-point step hook goes first, as it always
    has, then every hook of the tracer. Safe to call again."""
    safepoint.stop()
    if _tracer is not None:
        _tracer.uninstall()


_tracer: Optional[Tracer] = None
_tracer_lock = allocate_lock()

ENVIRONMENT = "PROBING_TORCH_TRACE"


def parse_environment(value: str) -> Dict[str, Any]:
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
        if key in ("", "1", "on", "true", "yes"):
            continue
        if key == "backward":
            options["backward"] = True
        elif key in ("every", "depth", "capacity") and argument.isdigit():
            options[key] = int(argument)
        elif key == "modules" and argument:
            options["modules"] = (options["modules"] or []) + [argument]
        else:
            raise ValueError(
                f"{ENVIRONMENT}: cannot use {item!r}; e.g. every=10,backward,depth=2,modules=GLOB"
            )
    return options


def start_from_environment(value: str) -> None:
    """PROBING=1 PROBING_TORCH_TRACE=1: trace from the first step. Runs at interpreter start-up,
    before the job imports torch: once `import torch` has run, every top-level module is hooked
    at its first call. Never raises; a problem is kept for `trace status`."""
    global start_error
    try:
        options = parse_environment(value)
    except ValueError as error:
        start_error = str(error)
        return

    def begin() -> None:
        global start_error
        try:
            active = tracer()
            active.configure_trace(
                options["every"],
                options["backward"],
                options["modules"],
                options["depth"],
                options["capacity"],
            )
            active.discover_at_first_call()
        except Exception as error:  # noqa: BLE001 - the job's import of torch must succeed
            start_error = f"{ENVIRONMENT}: {type(error).__name__}: {error}"

    if "torch.optim.optimizer" in sys.modules:
        begin()
    else:
        sys.meta_path.insert(0, _AfterImport("torch", begin))


start_error: Optional[str] = None


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
            then()

        loader.exec_module = exec_then
        return spec


def tracer(own_threads: Any = ()) -> Tracer:
    """The process's one tracer, made on first use; raises NoTorch before torch is imported."""
    global _tracer
    with _tracer_lock:
        if _tracer is None:
            _tracer = Tracer(require_torch())
        if own_threads:
            _tracer.own_threads = own_threads
        return _tracer


def current() -> Optional[Tracer]:
    return _tracer
