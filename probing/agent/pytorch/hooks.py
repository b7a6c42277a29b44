"""The hooks the tracer puts into the job: on its modules' calls and its optimizers' steps.

What gets hooked: the job's top-level modules (discovery.py) and every submodule under them
that `--modules`/`--depth` let through: a forward pre-hook and a forward hook each; and two
global optimizer step hooks (before and after every optimizer's step), which end steps
(clock.py). Module backward hooks are never used (backward.py says why).

Every hook runs in the training thread, and nothing in one may hurt the job: every hook body is
wrapped, a failure turns the feature off (`StepClock.failed`) and is reported by
`trace status`; the one exception raised on purpose is `NonFiniteError` under `nan on --stop`.
Torch iterates the global optimizer hooks as a live dict, so they are added and removed where
no step is iterating them (`safepoint.in_forward`).
"""

from __future__ import annotations

import fnmatch
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...originals import get_ident, perf_counter
from .backward import BackwardWalk
from .clock import StepClock, Traced
from .discovery import device_of, find_optimizers, find_roots, names_of, optimizer_on_cuda
from .finite import flat_tensors
from .nonfinite import NanChecks, NonFiniteError
from .safepoint import in_forward

# How long adding or removing the step hooks waits for a module call to do it in the
# training thread.
STEP_HOOKS_WAIT_S = 1.0


class Hooks:
    """The module and optimizer hooks of one tracer, and the steps they count."""

    def __init__(self, clock: StepClock, nan: NanChecks, walk: BackwardWalk) -> None:
        self.clock = clock
        self.nan = nan
        self.walk = walk
        self.torch = clock.torch
        self.lock = clock.lock
        self.own_threads: Any = ()
        self.patterns: Optional[List[str]] = None
        self.depth: Optional[int] = None
        self.traced: Dict[int, Traced] = {}
        self.roots: List[Tuple[str, Any]] = []  # (name, weakref)
        self.optimizers: weakref.WeakKeyDictionary[Any, Tuple[str, int]] = weakref.WeakKeyDictionary()
        self.optimizer_starts: Dict[int, Tuple[float, int, Any]] = {}
        self.global_handles: List[Any] = []
        self.discovery_handle: Any = None
        self.discovered: weakref.WeakSet[Any] = weakref.WeakSet()  # modules under a known root
        self.discovery_note: Optional[str] = None

    # --- installing and removing (agent thread, under the lock) ---------------------------------

    def wanted(self, name: str, depth: int) -> bool:
        if self.depth is not None and depth > self.depth:
            return False
        if self.patterns and not any(fnmatch.fnmatchcase(name, pattern) for pattern in self.patterns):
            return False
        return True

    def install(self) -> None:
        """Hook every wanted module of every top-level module, and the optimizers' steps."""
        torch = self.torch
        optimizers = find_optimizers(torch, self.own_threads)
        for optimizer in optimizers.items:
            self.name_optimizer(optimizer)
        self.clock.check_rank()
        roots = find_roots(torch, self.own_threads)
        for name, root in roots.items:
            self.add_root(name, root)
        # Said by `trace status`: models a bounded search may have missed.
        self.discovery_note = roots.note("trace", "models and optimizers")
        # Steps are counted once the modules are hooked, so that the first steps are whole.
        if not self.global_handles:
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            handles: List[Any] = []

            def add() -> None:
                handles.append(register_optimizer_step_pre_hook(self.optimizer_pre))
                handles.append(register_optimizer_step_post_hook(self.optimizer_post))

            self.edit_step_hooks(add)
            self.global_handles = handles

    def edit_step_hooks(self, change: Callable[[], None]) -> None:
        """Add or remove global optimizer hooks where no step is iterating them (safepoint.py)."""
        if get_ident() in self.own_threads:
            in_forward(self.torch, change, STEP_HOOKS_WAIT_S)
        else:  # the job's own thread (PROBING_TORCH_TRACE at import): it is not in a step
            change()

    def add_root(self, name: str, root: Any) -> None:
        self.nan.cover(name, root)  # NaN checks on: its weights are checked (weights.py)
        self.discovered.update(root.modules())
        if not any(ref() is root for _, ref in self.roots):
            self.roots = [(n, ref) for n, ref in self.roots if ref() is not None]
            self.roots.append((name, weakref.ref(root)))
        root_device = device_of(root)
        for qualified, module in root.named_modules(prefix=name):
            depth = qualified.count(".") - name.count(".")
            if not self.wanted(qualified, depth):
                continue
            known = self.traced.get(id(module))
            if known is not None and known.module() is module:
                continue
            device = device_of(module) or root_device
            self._hook(module, qualified, depth, device is not None and device.startswith("cuda"), depth == 0)

    def _hook(self, module: Any, name: str, depth: int, cuda: bool, is_root: bool) -> None:
        traced = Traced(module, name, depth, self.clock.ring, cuda)
        pre, post = self.hooks_for(traced, is_root)
        try:
            traced.handles.append(module.register_forward_pre_hook(pre))
            try:
                traced.handles.append(module.register_forward_hook(post, always_call=True))
            except TypeError:  # torch < 2.0 has no always_call
                traced.handles.append(module.register_forward_hook(post))
        except Exception:  # noqa: BLE001 - e.g. a TorchScript module, which takes no hooks
            for handle in traced.handles:
                handle.remove()
            return
        self.traced[id(module)] = traced

    def remove_module_hooks(self) -> int:
        removed = 0
        for traced in self.traced.values():
            for handle in traced.handles:
                handle.remove()
                removed += 1
            traced.handles = []
            traced.starts.clear()
        self.traced = {}
        return removed

    def remove_all(self) -> int:
        """Remove every hook; returns how many."""
        removed = self.remove_module_hooks()
        handles, self.global_handles = self.global_handles, []
        if handles:

            def remove() -> None:
                for handle in handles:
                    handle.remove()

            self.edit_step_hooks(remove)
            removed += len(handles)
        if self.discovery_handle is not None:
            self.discovery_handle.remove()
            self.discovery_handle = None
            removed += 1
        self.optimizer_starts.clear()
        return removed

    def count(self) -> int:
        hooks = sum(len(traced.handles) for traced in self.traced.values()) + len(self.global_handles)
        return hooks + (self.discovery_handle is not None)

    def discover_at_first_call(self) -> None:
        """PROBING_TORCH_TRACE: hook each top-level module when it is first called, until the first
        optimizer step (by then the models being trained have all run)."""
        from torch.nn.modules.module import register_module_forward_pre_hook

        def discover(module: Any, args: Any) -> None:
            try:
                if module in self.discovered:
                    return
                names = names_of([module])
                with self.lock:
                    self.add_root(names[id(module)], module)
            except Exception as error:  # noqa: BLE001
                self.clock.failed(error)

        with self.lock:
            self.install()
            if self.discovery_handle is None:  # PROBING_TORCH_TRACE and PROBING_NAN both asked
                self.discovery_handle = register_module_forward_pre_hook(discover)

    # --- steps (training thread) -------------------------------------------------------------------

    def new_step(self) -> None:
        self.walk.forget()
        self.clock.advance()

    def name_optimizer(self, optimizer: Any) -> Tuple[str, int]:
        known = self.optimizers.get(optimizer)
        if known is None:
            names = names_of([optimizer], self.own_threads)
            taken = {name for name, _ in self.optimizers.values()}
            name = names[id(optimizer)]
            if name in taken:
                name = f"{name}#{len(self.optimizers) + 1}"
            known = self.optimizers[optimizer] = (name, self.clock.ring.code(name))
        return known

    def optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        clock = self.clock
        try:
            if clock.step_pending and id(optimizer) in clock.stepped:
                self.new_step()  # it steps again with no traced module call in between
            clock.stepped.add(id(optimizer))
            clock.optimizer_seen = True
            if clock.tracing_now:
                event = None
                if optimizer_on_cuda(optimizer):
                    event = self.torch.cuda.Event(enable_timing=True)
                    event.record()
                self.optimizer_starts[id(optimizer)] = (perf_counter(), next(clock.seqs), event)
        except Exception as error:  # noqa: BLE001
            clock.failed(error)

    def optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        clock = self.clock
        try:
            start = self.optimizer_starts.pop(id(optimizer), None)
            if start is not None:
                end = perf_counter()
                events = None
                if start[2] is not None:
                    event = self.torch.cuda.Event(enable_timing=True)
                    event.record()
                    events = [start[2], event]
                name, code = self.name_optimizer(optimizer)
                type_code = clock.ring.code(type(optimizer).__name__)
                clock.append(code, type_code, "optimizer", clock.step, start[1], start[0], end, events,
                             optimizer_cuda=events is not None)  # fmt: skip
            clock.step_pending = True
            if self.discovery_handle is not None:
                with self.lock:
                    if self.discovery_handle is not None:
                        self.discovery_handle.remove()
                        self.discovery_handle = None
        except Exception as error:  # noqa: BLE001
            clock.failed(error)

    def hooks_for(self, traced: Traced, is_root: bool) -> Tuple[Callable[..., None], Callable[..., None]]:
        """The forward pre-hook and hook of one module: the hottest code here, run at every call
        of every hooked module, so each reads what it needs from closure variables."""
        hooks, clock, nan, walk, torch = self, self.clock, self.nan, self.walk, self.torch
        starts = traced.starts
        sequence_nr = walk.sequence_nr or (lambda: 0)

        def pre(module: Any, args: Any) -> None:
            try:
                if clock.step_pending:
                    hooks.new_step()
                if nan.weights_due:  # the weights are read here: a module boundary (weights.py)
                    nan.work_on_weights()
                if not clock.watching:
                    return
                event = None
                if traced.cuda and clock.tracing_now:
                    making = perf_counter()
                    event = torch.cuda.Event(enable_timing=True)
                    event.record()
                    clock.step_extra += perf_counter() - making
                starts.append((perf_counter(), next(clock.seqs), sequence_nr(), event))
            except Exception as error:  # noqa: BLE001
                clock.failed(error)

        def post(module: Any, args: Any, output: Any) -> None:
            try:
                if not starts:
                    if is_root and not clock.optimizer_seen and not hooks.optimizers:
                        clock.step_pending = True
                    return
                start, seq, counter, event = starts.pop()
                end = perf_counter()
                step = clock.step
                if clock.tracing_now:
                    events = None
                    if event is not None:
                        finished = torch.cuda.Event(enable_timing=True)
                        finished.record()
                        events = [event, finished]
                        clock.step_extra += perf_counter() - end
                    clock.record(traced, "forward", step, seq, start, end, events)
                backward = clock.tracing_now and clock.backward
                if backward or clock.nan_on:
                    outputs = flat_tensors(output, torch)
                    if clock.nan_on and nan.step != step:
                        nan.check_forward(traced, step, seq, args, outputs)
                    if walk.sequence_nr is not None:
                        walk.watch(traced, step, backward, counter, outputs)
                if is_root and not clock.optimizer_seen and not hooks.optimizers:
                    clock.step_pending = True  # no optimizer: each call of a model is a step
            except NonFiniteError:
                raise
            except Exception as error:  # noqa: BLE001
                clock.failed(error)

        return pre, post
