"""The hooks the tracer puts into the job: on its modules' calls and its optimizers' steps.

What gets hooked: the job's top-level modules (discovery.py) and every submodule under them
that `--modules`/`--depth` let through: a forward pre-hook and a forward hook each; and two
global optimizer step hooks (before and after every optimizer's step), which end steps
(clock.py). Module backward hooks are never used (backward.py says why).

The hooks of the modules below the top-level ones are there only for a step whose calls are
watched (a traced step, or every step while NaN checks are on): they are attached when such a
step begins and detached when one that is not begins, in the training thread, at the first call
of a top-level module, whose hooks stay (they mark the steps). An untraced step runs no hook
of this tracer but those: one call each of the top-level modules' and optimizers' hooks.
Torch copies a module's hooks before it calls them, so attaching from the agent's thread (`trace
on`) cannot disturb a call under way.

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
        self.steps_only: Dict[int, Traced] = {}  # top-level modules --modules/--depth leave out
        self.attached = False  # the hooks below the top-level modules are on
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
        self.sync()

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
                if depth == 0 and id(module) not in self.steps_only:  # its calls still mark steps
                    traced = Traced(module, qualified, 0, self.clock.ring, False)
                    traced.pair = self.hooks_for(traced, True, record=False)
                    if self.attach(traced):
                        self.steps_only[id(module)] = traced
                continue
            known = self.traced.get(id(module))
            if known is not None and known.module() is module:
                continue
            device = device_of(module) or root_device
            self._hook(module, qualified, depth, device is not None and device.startswith("cuda"))

    def _hook(self, module: Any, name: str, depth: int, cuda: bool) -> None:
        traced = Traced(module, name, depth, self.clock.ring, cuda)
        traced.pair = self.hooks_for(traced, traced.root)
        if not self.attach(traced):  # e.g. a TorchScript module, which takes no hooks
            return
        if not traced.root and not self.attached:
            self.detach(traced)
        self.traced[id(module)] = traced

    def attach(self, traced: Traced) -> bool:
        module = traced.module()
        if module is None or traced.handles:
            return module is not None
        pre, post = traced.pair
        try:
            traced.handles.append(module.register_forward_pre_hook(pre))
            try:
                traced.handles.append(module.register_forward_hook(post, always_call=True))
            except TypeError:  # torch < 2.0 has no always_call
                traced.handles.append(module.register_forward_hook(post))
        except Exception:  # noqa: BLE001
            self.detach(traced)
            return False
        return True

    @staticmethod
    def detach(traced: Traced) -> int:
        handles, traced.handles = traced.handles, []
        for handle in handles:
            handle.remove()
        traced.starts.clear()
        return len(handles)

    def sync(self) -> None:
        """Attach the hooks below the top-level modules for a watched step, detach them for one
        that is not (under the lock; the training thread at a step's first call, or the agent's
        when a switch changes)."""
        want = self.clock.watching
        if want == self.attached:
            return
        started = perf_counter()
        for traced in self.traced.values():
            if not traced.root:
                if want:
                    self.attach(traced)
                else:
                    self.detach(traced)
        self.attached = want
        self.clock.switch_cost[want] = perf_counter() - started

    def remove_module_hooks(self) -> int:
        removed = 0
        for traced in (*self.traced.values(), *self.steps_only.values()):
            removed += self.detach(traced)
        self.traced, self.steps_only = {}, {}
        self.attached = False
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
        """The hooks on the job now: on an untraced step, those of the top-level modules."""
        hooks = sum(len(traced.handles) for traced in (*self.traced.values(), *self.steps_only.values()))
        return hooks + len(self.global_handles) + (self.discovery_handle is not None)

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
        """The step ends at the first call of the next (training thread): the checks made since
        the last optimizer step are read, then the next step is chosen traced or not."""
        self.walk.forget()
        clock = self.clock
        if self.nan.ledger.checks:
            self.nan.settle()
        clock.advance()
        # The agent's thread may hold the lock a while (`trace on` searches the heap for models):
        # the job never waits for it; the hooks follow at the next step instead.
        if clock.watching != self.attached and self.lock.acquire(blocking=False):
            try:
                self.sync()
            finally:
                self.lock.release()

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
            if self.nan.ledger.checks:
                self.nan.settle()  # before the update: --stop stops it, weights are as computed with
            if clock.tracing_now:
                entered, event = perf_counter(), None
                if optimizer_on_cuda(optimizer):
                    event = clock.cuda_event()
                started = perf_counter()
                self.optimizer_starts[id(optimizer)] = (started, next(clock.seqs), event)
                clock.step_cost += started - entered
        except NonFiniteError:
            raise
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
                    event = clock.cuda_event()
                    events = [start[2], event]
                name, code = self.name_optimizer(optimizer)
                type_code = clock.ring.code(type(optimizer).__name__)
                clock.append(code, type_code, "optimizer", clock.step, start[1], start[0], end, events,
                             optimizer_cuda=events is not None)  # fmt: skip
                clock.step_cost += perf_counter() - end
            clock.step_pending = True
            if self.discovery_handle is not None:
                with self.lock:
                    if self.discovery_handle is not None:
                        self.discovery_handle.remove()
                        self.discovery_handle = None
        except Exception as error:  # noqa: BLE001
            clock.failed(error)

    def hooks_for(
        self, traced: Traced, is_root: bool, record: bool = True
    ) -> Tuple[Callable[..., None], Callable[..., None]]:
        """The forward pre-hook and hook of one module: the hottest code here, run at every call
        of every hooked module, so each reads what it needs from closure variables. A top-level
        module that --modules/--depth leave out gets them with `record` False: they mark steps."""
        hooks, clock, nan, walk, torch = self, self.clock, self.nan, self.walk, self.torch
        starts = traced.starts
        sequence_nr = walk.sequence_nr or (lambda: 0)

        def pre(module: Any, args: Any) -> None:
            try:
                if clock.step_pending:
                    hooks.new_step()
                if nan.weights_due:  # the weights are read here: a module boundary (weights.py)
                    nan.work_on_weights()
                if nan.ledger.batched and module.__dict__.get("inplace") is True:
                    nan.ledger.flush()  # before it writes its input, which may wait in the batch
                if not record or not clock.watching:
                    return
                entered = perf_counter()
                event = clock.cuda_event() if traced.cuda and clock.tracing_now else None
                started = perf_counter()
                starts.append((started, next(clock.seqs), sequence_nr(), event))
                clock.step_cost += started - entered  # counted on traced steps alone (clock.py)
            except NonFiniteError:
                raise
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
                tracing = clock.tracing_now
                if tracing:
                    events = None if event is None else [event, clock.cuda_event()]
                    clock.record(traced, "forward", step, seq, start, end, events)
                backward = tracing and clock.backward and walk.sequence_nr is not None
                if backward or clock.nan_on:
                    outputs = flat_tensors(output, torch)
                    if clock.nan_on and nan.step != step:
                        nan.check_forward(traced, step, seq, args, outputs, counter)
                    if backward:
                        walk.watch(traced, step, counter, outputs)
                if is_root and not clock.optimizer_seen and not hooks.optimizers:
                    clock.step_pending = True  # no optimizer: each call of a model is a step
                clock.step_cost += perf_counter() - end
            except Exception as error:  # noqa: BLE001 - NonFiniteError is raised at the step's end
                clock.failed(error)

        return pre, post
