"""Tracing a live PyTorch job: per-module timings, optimizer steps and NaN/Inf checks.

Imported only when a client asks for a torch feature (or PROBING_TORCH_TRACE is set), and it
imports torch only when the job already has (`require_torch`). One tracer a process, made of:

- discovery.py: the job's models and optimizers, and their names;
- hooks.py: the forward hooks on the models' modules and the global optimizer step hooks;
- clock.py: step numbers, which steps are traced, the rows (CUDA durations from events);
- backward.py: the backward pass of each module, timed by autograd node hooks;
- nonfinite.py: the NaN/Inf checks and `NonFiniteError`; ledger.py: their values, reduced on the
  device and read once a step; weights.py: the checks of the weights.

This module turns them on and off (from the agent's thread, under the tracer's lock) and says
what they are doing (`trace status`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from ...originals import RLock, allocate_lock, get_ident
from ..lifecycle import JOB_HOOKS, on_stop
from ..ring import Ring
from . import safepoint
from .backward import BackwardWalk
from .clock import QUIET_FOREVER, QUIET_STEPS, StepClock
from .discovery import NoTorch, require_torch
from .hooks import Hooks
from .nonfinite import WEIGHTS_WAIT_S, NanChecks, NonFiniteError

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
        self.walk = BackwardWalk(self.clock, sequence_nr)
        self.nan.sequence_nr = sequence_nr
        self.hooks = Hooks(self.clock, self.nan, self.walk)
        hooks = self.hooks
        self.nan.hooked = lambda module: id(module) in hooks.traced

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
            clock.quiet_steps = QUIET_FOREVER  # until the search below is over (clock.advance)
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
            clock.refresh()
            try:
                self._install()
            finally:
                clock.shares.clear()
                clock.quiet_steps = QUIET_STEPS

    def configure_nan(self, on: bool, stop: bool) -> None:
        """NaN checks on or off. Turned on from the agent's thread (`nan on`), it waits up to
        WEIGHTS_WAIT_S for the training thread to check the weights, so that the reply says
        what they were when the checks began; `nan status` says it later otherwise."""
        clock = self.clock
        with self.lock:
            starting = on and not clock.nan_on
            clock.nan_on = on
            self.nan.stop = stop and on
            if on:
                clock.error = None
                if starting:
                    self.nan.begin()
                self.nan.step = -1
                self._install()  # each model found is queued for the start check (nan.cover)
            else:
                self.nan.end()
            clock.refresh()
            if not clock.trace_on and not clock.nan_on:
                self.uninstall()
            else:
                self.hooks.sync()
            weights = self.nan.weights
        if starting and get_ident() in self.hooks.own_threads:
            weights.finished.wait(WEIGHTS_WAIT_S)

    def trace_off(self) -> None:
        with self.lock:
            self.clock.trace_on = False
            self.clock.refresh()
            if not self.clock.nan_on:
                self.uninstall()
            else:
                self.hooks.sync()

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
            self.nan.end()
            return removed

    def hook_count(self) -> int:
        return self.hooks.count()

    def is_hooked(self, module: Any) -> bool:
        """Whether its calls are traced (its hooks are on for the steps that are)."""
        traced = self.hooks.traced.get(id(module))
        return traced is not None and traced.module() is module

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
                "nan_session": nan.status(),
                "rank": clock.rank,
                "error": clock.error or start_error,
                "notes": [hooks.discovery_note] if hooks.discovery_note else [],
            }


def stop() -> None:
    """Detach (a stop hook, at JOB_HOOKS): the safe-point step hook goes first, as it always
    has, then every hook of the tracer. Safe to call again."""
    safepoint.stop()
    if _tracer is not None:
        _tracer.uninstall()


_tracer: Optional[Tracer] = None
_tracer_lock = allocate_lock()

# A problem PROBING_TORCH_TRACE or PROBING_NAN met at start-up (environment.py), for status.
start_error: Optional[str] = None


def note_start_error(error: str) -> None:
    global start_error
    start_error = error


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
