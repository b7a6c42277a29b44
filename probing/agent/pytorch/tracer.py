"""Tracing a live PyTorch job: per-module timings, optimizer steps and NaN/Inf checks.

Imported only when a client asks for a torch feature (or PROBING_TORCH_TRACE is set), and it
imports torch only when the job already has (`require_torch`).

What gets hooked: the job's top-level modules (found in `__main__`, in the frames of its
threads, or by gc; a module that is another found module's child is not top-level) and every
submodule under them that `--modules`/`--depth` let through: a forward pre-hook and a forward
hook each. Steps come from global optimizer step hooks (`torch.optim.optimizer`), so every
optimizer is seen, whenever it was made: the first module call after an optimizer step starts
the next step, so micro-batches of gradient accumulation share a step number and several
optimizers stepping one after the other close one step. A job with no optimizer counts calls of
its top-level module instead.

Backward timing and gradient checks use autograd graph node hooks, never module backward hooks:
`register_full_backward_hook` wraps the module's outputs in a custom autograd Function, and a
job that then modifies such an output in place (`out += identity` in every ResNet block) fails
with "a view ... is being modified inplace"; turning tracing on would crash the job. Node hooks
change neither the graph nor the tensors. When a traced module's forward returns, the nodes it
created are those reachable from its outputs' `grad_fn` whose sequence numbers lie between the
autograd counter's values before and after the call (each node takes the next number when it
is made); a prehook on the output nodes marks the start of the module's backward (its output
gradient is complete) and a post-hook on each node at the edge of that set (where gradients
leave the module for its inputs and parameters) marks the end, when the last of them has run.
The walk costs about a microsecond per node, and is made only on traced steps with `--backward`
or while NaN checks are on. The hooks die with the graph at the end of the backward pass.

Durations are perf_counter intervals on CPU. For modules on a CUDA device they come from CUDA
events recorded around the call and read once the device has passed them (`Event.query()`, at
step boundaries and when the table is fetched): nothing here ever synchronises the device on
the training thread. NaN checks do read each checked value (`.item()`), which on CUDA waits for
the device: they are a diagnostic mode, off by default.

Nothing in a hook may hurt the job: every hook body is wrapped, a failure turns the feature off
and is reported by `trace status`; the one exception raised on purpose is `NonFiniteError`
under `nan on --stop`.
"""

from __future__ import annotations

import fnmatch
import gc
import itertools
import math
import os
import sys
import threading
import time
import weakref
from time import perf_counter
from types import FrameType
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..ring import Ring

# Without --every, the tracer picks how many steps apart traced steps are, after each traced
# step: the estimated cost of tracing it (its calls times the cost of one traced call, measured
# on this machine when tracing starts, plus the time spent walking autograd graphs) stays under
# this share of the step time. A CPU transformer step of 300 ms with 60 modules costs ~0.1%:
# every step is traced; a 10 ms GPU step with 200 modules is traced one step in a few.
DEFAULT_BUDGET = 0.01
MAX_AUTO_EVERY = 100
DEFAULT_CAPACITY = 1_000_000
NAN_CAPACITY = 10_000
MB = 1024.0 * 1024.0
# A module whose autograd subgraph is larger than this is timed forward only (the walk would
# cost more than the module); its backward shows up in its parent's row.
MAX_WALK_NODES = 20_000


class NoTorch(Exception):
    """The job has not imported torch; raised to the handler, which says so."""


class NonFiniteError(FloatingPointError):
    """Raised in the training thread by `probing PID nan on --stop` at the first NaN/Inf."""


def require_torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "nn") or "torch.optim.optimizer" not in sys.modules:
        raise NoTorch("this process has not imported torch")
    return torch


def _flat_tensors(value: Any, torch: Any, limit: int = 64) -> List[Any]:
    """Tensors in a module's output or inputs: a tensor, or nested tuples, lists and dicts."""
    found: List[Any] = []
    stack = [value]
    while stack and len(found) < limit:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found


def nonfinite(tensors: Sequence[Any], torch: Any) -> Optional[Tuple[int, int, int]]:
    """(index, nan count, inf count) of the first tensor holding NaN or Inf, or None.

    One reduction per tensor (aminmax: min and max are both finite exactly when every value
    is, since NaN propagates); the counts are computed only for the offending tensor.
    """
    for index, tensor in enumerate(tensors):
        if tensor is None or not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        data = tensor.detach()
        low, high = torch.aminmax(data)
        if math.isfinite(low.item()) and math.isfinite(high.item()):
            continue
        return index, int(torch.isnan(data).sum().item()), int(torch.isinf(data).sum().item())
    return None


def describe_tensor(tensor: Any) -> str:
    dtype = str(tensor.dtype).replace("torch.", "")
    return f"{dtype}{list(tensor.shape)} on {tensor.device}"


# --- names -----------------------------------------------------------------------------------


def _namespaces(own_threads: Any) -> Iterator[Dict[str, Any]]:
    """Where the job keeps its objects: `__main__`, then the locals of every thread's frames,
    outermost first (the training loop's `model` before a helper's `m`)."""
    main = sys.modules.get("__main__")
    if main is not None:
        yield vars(main)
    for ident, innermost in sys._current_frames().items():
        if ident in own_threads:
            continue
        frames = []
        frame: Optional[FrameType] = innermost
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        for outer in reversed(frames):
            try:
                yield outer.f_locals
            except Exception:  # noqa: BLE001 - a frame that cannot show its locals
                continue


def names_of(objects: Sequence[Any], own_threads: Any = ()) -> Dict[int, str]:
    """A readable name for each object: the variable that holds it (`model`), or an attribute
    of such a variable (`trainer.model`, `self.model`)."""
    wanted = {id(item) for item in objects}
    names: Dict[int, str] = {}
    holders: List[Tuple[str, Any]] = []
    for namespace in _namespaces(own_threads):
        for key, value in list(namespace.items()):
            if key.startswith("__"):
                continue
            if id(value) in wanted and id(value) not in names:
                names[id(value)] = key
            elif (
                hasattr(value, "__dict__")
                and not isinstance(value, type)
                and type(value).__name__ != "module"
            ):
                holders.append((key, value))
    for key, holder in holders:
        if len(names) == len(wanted):
            break
        try:
            attributes = list(vars(holder).items())
        except TypeError:
            continue
        for attribute, value in attributes:
            if id(value) in wanted and id(value) not in names:
                names[id(value)] = f"{key}.{attribute}"
    taken: Dict[str, int] = {}
    for item in objects:
        name = names.get(id(item)) or type(item).__name__
        count = taken[name] = taken.get(name, 0) + 1
        names[id(item)] = name if count == 1 else f"{name}#{count}"
    return names


def instances_of(cls: type) -> List[Any]:
    """Live objects of a class, by gc. Compared by type, not isinstance: isinstance reads
    `__class__`, which some lazy module proxies answer with a warning on the job's stderr."""
    return [item for item in gc.get_objects() if issubclass(type(item), cls)]


def find_roots(torch: Any, own_threads: Any = (), fresh_s: float = 0.0) -> List[Tuple[str, Any]]:
    """The job's top-level modules, named: every live nn.Module that is no other's child.

    With `fresh_s`, a walk made less than that long ago is reused, and callers arriving during
    a walk wait for it: the walk over every object gc tracks is most of a model-table query
    (75 ms on a job of 290 000 objects, holding the GIL in stretches), and four clients
    querying at once made four of them, the job's steps stalled meanwhile.
    """
    global _roots_seen
    if not fresh_s:
        return _walk_roots(torch, own_threads)
    with _roots_lock:
        seen = _roots_seen
        if seen is not None and time.monotonic() - seen[0] < fresh_s:
            roots = [(name, ref()) for name, ref in seen[1]]
            if all(module is not None for _, module in roots):
                return roots
        roots = _walk_roots(torch, own_threads)
        _roots_seen = (time.monotonic(), [(name, weakref.ref(module)) for name, module in roots])
        return roots


_roots_lock = threading.Lock()
_roots_seen: Optional[Tuple[float, List[Tuple[str, Callable[[], Any]]]]] = None


def _walk_roots(torch: Any, own_threads: Any) -> List[Tuple[str, Any]]:
    module_type = torch.nn.Module
    found = instances_of(module_type)
    children = set()
    for module in found:
        for child in module.children():
            children.add(id(child))
    roots = [module for module in found if id(module) not in children]
    names = names_of(roots, own_threads)
    named = sorted(((names[id(module)], module) for module in roots), key=lambda pair: pair[0])
    return named


def find_optimizers(torch: Any) -> List[Any]:
    optimizer_type = torch.optim.Optimizer
    return instances_of(optimizer_type)


# --- the tracer --------------------------------------------------------------------------------


class _Traced:
    """One hooked module: its handles, names, and the calls of it under way."""

    __slots__ = (
        "module",
        "name",
        "type_name",
        "name_code",
        "type_code",
        "depth",
        "cuda",
        "handles",
        "starts",
    )

    def __init__(self, module: Any, name: str, depth: int, ring: Ring, cuda: bool) -> None:
        self.module = weakref.ref(module)
        self.name = name
        self.type_name = type(module).__name__
        self.name_code = ring.code(name)
        self.type_code = ring.code(self.type_name)
        self.depth = depth
        self.cuda = cuda
        self.handles: List[Any] = []
        # (start, seq, autograd counter, CUDA start event) per call under way: a stack, as a
        # module may call itself.
        self.starts: List[Tuple[float, int, int, Any]] = []


class _Backward:
    """The backward pass of one forward call of one module, timed by graph node hooks."""

    __slots__ = ("tracer", "traced", "step", "timed", "started", "seq", "left", "events", "checked")

    def __init__(self, tracer: Tracer, traced: _Traced, step: int, timed: bool, edges: int) -> None:
        self.tracer = tracer
        self.traced = traced
        self.step = step
        self.timed = timed
        self.started: Optional[float] = None
        self.seq = 0
        self.left = edges
        self.events: Optional[List[Any]] = None
        self.checked = False  # its output gradient was finite (so a bad input gradient is its own)

    def begin(self, grad_outputs: Any) -> None:
        tracer = self.tracer
        try:
            if self.started is None:
                self.started = perf_counter()
                self.seq = next(tracer.seqs)
                if self.timed and self.traced.cuda:
                    event = tracer.torch.cuda.Event(enable_timing=True)
                    event.record()
                    self.events = [event]
                if tracer.nan_on:
                    self.checked = nonfinite(grad_outputs, tracer.torch) is None
        except NonFiniteError:
            raise
        except Exception as error:  # noqa: BLE001 - never break the job's backward pass
            tracer.failed(error)

    def edge_done(self, grad_inputs: Any, grad_outputs: Any) -> None:
        tracer = self.tracer
        try:
            if self.started is None:
                return
            if tracer.nan_on and tracer.nan_step != self.step:
                found = nonfinite(grad_inputs, tracer.torch)
                if found is not None:
                    tensor = grad_inputs[found[0]]
                    tracer.nan_event(self.traced, "backward", self.step, self.seq, f"grad_input[{found[0]}] "
                                     + describe_tensor(tensor), found[1], found[2], self.checked)  # fmt: skip
            self.left -= 1
            if self.left > 0 or not self.timed:
                return
            end = perf_counter()
            if self.events is not None:
                event = tracer.torch.cuda.Event(enable_timing=True)
                event.record()
                self.events.append(event)
            tracer.record(self.traced, "backward", self.step, self.seq, self.started, end, self.events)
        except NonFiniteError:
            raise
        except Exception as error:  # noqa: BLE001 - never break the job's backward pass
            tracer.failed(error)


class Tracer:
    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.lock = threading.RLock()
        self.trace_on = False
        self.nan_on = False
        self.stop_on_nan = False
        self.every = 1
        self.auto_every = True
        self.call_cost = 5e-6  # seconds per traced call, measured by calibrate()
        self.step_calls = 0  # traced calls in the current step
        self.step_walk = 0.0  # seconds spent walking autograd graphs in the current step
        self.walks: Dict[Any, List[Tuple[Any, List[Any]]]] = {}  # output node -> module's edges
        self.backward = False
        self.patterns: Optional[List[str]] = None
        self.depth: Optional[int] = None
        self.ring = Ring("python.torch_trace", _columns("python.torch_trace"), DEFAULT_CAPACITY)
        self.nan_ring = Ring("python.nan_events", _columns("python.nan_events"), NAN_CAPACITY)
        self.stage_codes = {stage: self.ring.code(stage) for stage in ("forward", "backward", "optimizer")}
        self.nan_stage_codes = {stage: self.nan_ring.code(stage) for stage in ("forward", "backward")}
        self.traced: Dict[int, _Traced] = {}
        self.roots: List[Tuple[str, Any]] = []  # (name, weakref)
        self.optimizers: weakref.WeakKeyDictionary[Any, Tuple[str, int]] = weakref.WeakKeyDictionary()
        self.optimizer_starts: Dict[int, Tuple[float, int, Any]] = {}
        self.global_handles: List[Any] = []
        self.discovery_handle: Any = None
        self.discovered: weakref.WeakSet[Any] = weakref.WeakSet()  # modules under a known root
        self.step = 0
        self.seqs = itertools.count()
        self.step_pending = False
        self.optimizer_seen = False
        self.stepped: set[int] = set()  # optimizers that stepped in the current step
        self.tracing_now = False
        self.watching = False
        self.step_start = perf_counter()
        self.clock = (time.time(), perf_counter())
        self.rank = 0
        self.rank_known = False
        self.nan_step = -1
        self.nan_events = 0
        self.stopped_at: Optional[int] = None
        self.pending_cuda: List[Tuple[Tuple[Any, ...], Any, Any]] = []
        self.error: Optional[str] = None
        self.own_threads: Any = ()
        self.sequence_nr: Optional[Callable[[], int]] = getattr(
            getattr(torch._C, "_autograd", None), "_get_sequence_nr", None
        )

    # --- switches (agent thread) ---------------------------------------------------------------

    def configure_trace(
        self,
        every: Optional[int],
        backward: bool,
        patterns: Optional[List[str]],
        depth: Optional[int],
        capacity: Optional[int],
    ) -> None:
        with self.lock:
            if backward and self.sequence_nr is None:
                raise ValueError("--backward needs torch >= 2.0 (torch._C._autograd._get_sequence_nr)")
            self.auto_every = every is None
            self.every = every or 1
            self.backward = backward
            if capacity and capacity != self.ring.capacity:
                # The hooks hold codes of the old ring's dictionary: they go, and come back below.
                self._remove_module_hooks()
                self.ring = Ring("python.torch_trace", _columns("python.torch_trace"), capacity)
                self.stage_codes = {s: self.ring.code(s) for s in ("forward", "backward", "optimizer")}
            if patterns != self.patterns or depth != self.depth:
                self._remove_module_hooks()
            self.patterns, self.depth = patterns, depth
            self.trace_on = True
            self.error = None
            if self.auto_every:
                self.call_cost = calibrate(self.torch)
            self._refresh_flags()
            self._install()

    def configure_nan(self, on: bool, stop: bool) -> None:
        with self.lock:
            self.nan_on = on
            self.stop_on_nan = stop and on
            if on:
                self.error = None
                self.nan_step = -1
                self._install()
            self._refresh_flags()
            if not self.trace_on and not self.nan_on:
                self.uninstall()

    def trace_off(self) -> None:
        with self.lock:
            self.trace_on = False
            self._refresh_flags()
            if not self.nan_on:
                self.uninstall()

    def _refresh_flags(self) -> None:
        sampled = self.step % self.every == 0
        self.tracing_now = self.trace_on and sampled
        self.watching = self.tracing_now or self.nan_on

    def failed(self, error: BaseException) -> None:
        """A hook failed: stop everything rather than risk the job, and say why in status."""
        self.error = f"{type(error).__name__}: {error}"
        self.trace_on = self.nan_on = False
        self.tracing_now = self.watching = False

    # --- installing and removing hooks ------------------------------------------------------------

    def _wanted(self, name: str, depth: int) -> bool:
        if self.depth is not None and depth > self.depth:
            return False
        if self.patterns and not any(fnmatch.fnmatchcase(name, pattern) for pattern in self.patterns):
            return False
        return True

    def _install(self) -> None:
        """Hook every wanted module of every top-level module, and the optimizers' steps."""
        torch = self.torch
        for optimizer in find_optimizers(torch):
            self._name_optimizer(optimizer)
        self._check_rank()
        for name, root in find_roots(torch, self.own_threads):
            self.add_root(name, root)
        # Steps are counted once the modules are hooked, so that the first steps are whole.
        if not self.global_handles:
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            handles: List[Any] = []

            def add() -> None:
                handles.append(register_optimizer_step_pre_hook(self._optimizer_pre))
                handles.append(register_optimizer_step_post_hook(self._optimizer_post))

            self._edit_step_hooks(add)
            self.global_handles = handles

    def _edit_step_hooks(self, change: Callable[[], None]) -> None:
        """Add or remove global optimizer hooks where no step is iterating them (safepoint.py)."""
        if threading.get_ident() in self.own_threads:
            from .safepoint import in_forward

            in_forward(self.torch, change, 1.0)
        else:  # the job's own thread (PROBING_TORCH_TRACE at import): it is not in a step
            change()

    def add_root(self, name: str, root: Any) -> None:
        self.discovered.update(root.modules())
        if not any(ref() is root for _, ref in self.roots):
            self.roots = [(n, ref) for n, ref in self.roots if ref() is not None]
            self.roots.append((name, weakref.ref(root)))
        root_device = _device_of(root)
        for qualified, module in root.named_modules(prefix=name):
            depth = qualified.count(".") - name.count(".")
            if not self._wanted(qualified, depth):
                continue
            known = self.traced.get(id(module))
            if known is not None and known.module() is module:
                continue
            device = _device_of(module) or root_device
            self._hook(module, qualified, depth, device is not None and device.startswith("cuda"), depth == 0)

    def _hook(self, module: Any, name: str, depth: int, cuda: bool, is_root: bool) -> None:
        traced = _Traced(module, name, depth, self.ring, cuda)
        pre, post = self._hooks_for(traced, is_root)
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

    def _remove_module_hooks(self) -> int:
        removed = 0
        for traced in self.traced.values():
            for handle in traced.handles:
                handle.remove()
                removed += 1
            traced.handles = []
            traced.starts.clear()
        self.traced = {}
        return removed

    def uninstall(self) -> int:
        """Remove every hook this tracer added; returns how many."""
        with self.lock:
            removed = self._remove_module_hooks()
            handles, self.global_handles = self.global_handles, []
            if handles:

                def remove() -> None:
                    for handle in handles:
                        handle.remove()

                self._edit_step_hooks(remove)
                removed += len(handles)
            if self.discovery_handle is not None:
                self.discovery_handle.remove()
                self.discovery_handle = None
                removed += 1
            self.trace_on = self.nan_on = self.tracing_now = self.watching = False
            self.stop_on_nan = False
            self.optimizer_starts.clear()
            return removed

    def hook_count(self) -> int:
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
                self.failed(error)

        with self.lock:
            self._install()
            self.discovery_handle = register_module_forward_pre_hook(discover)

    # --- steps ------------------------------------------------------------------------------------

    def _check_rank(self) -> None:
        distributed = sys.modules.get("torch.distributed")
        try:
            if distributed is not None and distributed.is_available() and distributed.is_initialized():
                self.rank = distributed.get_rank()
                self.rank_known = True
                return
        except Exception:  # noqa: BLE001
            pass
        self.rank = int(os.environ.get("RANK", "0") or 0)

    def _new_step(self) -> None:
        now = perf_counter()
        if self.auto_every and self.tracing_now and self.step_calls:
            cost = self.step_calls * self.call_cost + self.step_walk
            work = max(now - self.step_start - cost, 1e-9)
            self.every = max(1, min(MAX_AUTO_EVERY, math.ceil(cost / (DEFAULT_BUDGET * work))))
        self.step_calls = 0
        self.step_walk = 0.0
        self.walks.clear()
        self.step_pending = False
        self.stepped.clear()
        self.step += 1
        self.seqs = itertools.count()
        self.step_start = now
        self._refresh_flags()
        if not self.rank_known:
            self._check_rank()
        if self.pending_cuda:
            self.resolve_cuda()

    def _name_optimizer(self, optimizer: Any) -> Tuple[str, int]:
        known = self.optimizers.get(optimizer)
        if known is None:
            names = names_of([optimizer], self.own_threads)
            taken = {name for name, _ in self.optimizers.values()}
            name = names[id(optimizer)]
            if name in taken:
                name = f"{name}#{len(self.optimizers) + 1}"
            known = self.optimizers[optimizer] = (name, self.ring.code(name))
        return known

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.step_pending and id(optimizer) in self.stepped:
                self._new_step()  # it steps again with no traced module call in between
            self.stepped.add(id(optimizer))
            self.optimizer_seen = True
            if self.tracing_now:
                event = None
                if _optimizer_on_cuda(optimizer):
                    event = self.torch.cuda.Event(enable_timing=True)
                    event.record()
                self.optimizer_starts[id(optimizer)] = (perf_counter(), next(self.seqs), event)
        except Exception as error:  # noqa: BLE001
            self.failed(error)

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            start = self.optimizer_starts.pop(id(optimizer), None)
            if start is not None:
                end = perf_counter()
                events = None
                if start[2] is not None:
                    event = self.torch.cuda.Event(enable_timing=True)
                    event.record()
                    events = [start[2], event]
                name, code = self._name_optimizer(optimizer)
                self._append(code, self.ring.code(type(optimizer).__name__), "optimizer", self.step, start[1],
                             start[0], end, events, optimizer_cuda=events is not None)  # fmt: skip
            self.step_pending = True
            if self.discovery_handle is not None:
                with self.lock:
                    if self.discovery_handle is not None:
                        self.discovery_handle.remove()
                        self.discovery_handle = None
        except Exception as error:  # noqa: BLE001
            self.failed(error)

    # --- per call -----------------------------------------------------------------------------

    def _hooks_for(self, traced: _Traced, is_root: bool) -> Tuple[Callable[..., None], Callable[..., None]]:
        tracer = self
        starts = traced.starts
        sequence_nr = self.sequence_nr or (lambda: 0)

        def pre(module: Any, args: Any) -> None:
            try:
                if tracer.step_pending:
                    tracer._new_step()
                if not tracer.watching:
                    return
                event = None
                if traced.cuda and tracer.tracing_now:
                    event = tracer.torch.cuda.Event(enable_timing=True)
                    event.record()
                starts.append((perf_counter(), next(tracer.seqs), sequence_nr(), event))
            except Exception as error:  # noqa: BLE001
                tracer.failed(error)

        def post(module: Any, args: Any, output: Any) -> None:
            try:
                if not starts:
                    if is_root and not tracer.optimizer_seen and not tracer.optimizers:
                        tracer.step_pending = True
                    return
                start, seq, counter, event = starts.pop()
                end = perf_counter()
                step = tracer.step
                if tracer.tracing_now:
                    events = None
                    if event is not None:
                        finished = tracer.torch.cuda.Event(enable_timing=True)
                        finished.record()
                        events = [event, finished]
                    tracer.record(traced, "forward", step, seq, start, end, events)
                backward = tracer.tracing_now and tracer.backward
                if backward or tracer.nan_on:
                    outputs = _flat_tensors(output, tracer.torch)
                    if tracer.nan_on and tracer.nan_step != step:
                        tracer.check_forward(traced, step, seq, args, outputs)
                    if tracer.sequence_nr is not None:
                        tracer.watch_backward(traced, step, backward, counter, outputs)
                if is_root and not tracer.optimizer_seen and not tracer.optimizers:
                    tracer.step_pending = True  # no optimizer: each call of a model is a step
            except NonFiniteError:
                raise
            except Exception as error:  # noqa: BLE001
                tracer.failed(error)

        return pre, post

    def record(
        self, traced: _Traced, stage: str, step: int, seq: int, start: float, end: float, events: Any
    ) -> None:
        self._append(traced.name_code, traced.type_code, stage, step, seq, start, end, events, traced.cuda)

    def _append(
        self, name_code: int, type_code: int, stage: str, step: int, seq: int, start: float, end: float,
        events: Any, optimizer_cuda: bool = False,
    ) -> None:  # fmt: skip
        self.step_calls += 1
        wall = self.clock[0] + (start - self.clock[1])
        row: Tuple[Any, ...]
        if optimizer_cuda:
            cuda = self.torch.cuda
            row = (step, seq, name_code, type_code, self.stage_codes[stage], end - start,
                   start - self.step_start, cuda.memory_allocated() / MB, cuda.max_memory_allocated() / MB,
                   cuda.memory_reserved() / MB, self.rank, wall)  # fmt: skip
        else:
            row = (step, seq, name_code, type_code, self.stage_codes[stage], end - start,
                   start - self.step_start, None, None, None, self.rank, wall)  # fmt: skip
        if events is None:
            self.ring.append(row)
        else:
            with self.lock:
                self.pending_cuda.append((row, events[0], events[-1]))

    def resolve_cuda(self) -> None:
        """Fill in the durations of CUDA calls the device has finished, oldest first."""
        with self.lock:
            done = 0
            for row, start, end in self.pending_cuda:
                if not end.query():
                    break
                finished = list(row)
                finished[5] = start.elapsed_time(end) / 1000.0
                self.ring.append(finished)
                done += 1
            del self.pending_cuda[:done]

    def watch_backward(
        self, traced: _Traced, step: int, timed: bool, counter: int, outputs: List[Any]
    ) -> None:
        started = perf_counter()
        try:
            self._walk(traced, step, timed, counter, outputs)
        finally:
            if traced.depth == 0:
                self.walks.clear()  # they hold graph nodes, and so the forward's saved tensors
            self.step_walk += perf_counter() - started

    def _walk(self, traced: _Traced, step: int, timed: bool, counter: int, outputs: List[Any]) -> None:
        after = self.sequence_nr() if self.sequence_nr is not None else 0
        heads = []
        for tensor in outputs:
            node = tensor.grad_fn
            if node is not None and counter <= node._sequence_nr() < after and node not in heads:
                heads.append(node)
        if not heads:
            return
        # A submodule's forward returned before this one's, and its walk left a summary under its
        # output node: (edge node, where gradients go from it). The walk jumps over the
        # submodule's nodes through it, so a forward pass walks each node about once, however
        # deep the modules nest.
        summaries = self.walks
        seen = set(heads)
        stack = list(heads)
        edges = []
        summary = []
        while stack:
            node = stack.pop()
            below = summaries.get(node)
            steps = (
                below if below is not None else [(node, [n for n, _ in node.next_functions if n is not None])]
            )
            for edge, targets in steps:
                exits = []
                for next_node in targets:
                    if counter <= next_node._sequence_nr() < after:
                        if next_node not in seen:
                            seen.add(next_node)
                            stack.append(next_node)
                    else:
                        exits.append(next_node)
                if exits or not targets:
                    edges.append(edge)
                    summary.append((edge, exits))
            if len(seen) > MAX_WALK_NODES:
                return
        for node in heads:
            summaries[node] = summary
        backward = _Backward(self, traced, step, timed, len(edges))
        for node in heads:
            node.register_prehook(lambda grad_outputs, b=backward: b.begin(grad_outputs))
        for node in edges:
            node.register_hook(
                lambda grad_inputs, grad_outputs, b=backward: b.edge_done(grad_inputs, grad_outputs)
            )

    # --- NaN/Inf -------------------------------------------------------------------------------

    def check_forward(self, traced: _Traced, step: int, seq: int, args: Any, outputs: List[Any]) -> None:
        found = nonfinite(outputs, self.torch)
        if found is None:
            return
        inputs_finite = nonfinite(_flat_tensors(args, self.torch), self.torch) is None
        where = f"output[{found[0]}] " + describe_tensor(outputs[found[0]])
        self.nan_event(traced, "forward", step, seq, where,
                       found[1], found[2], inputs_finite)  # fmt: skip

    def nan_event(
        self, traced: _Traced, stage: str, step: int, seq: int, tensor: str, nans: int, infs: int,
        inputs_finite: bool,
    ) -> None:  # fmt: skip
        ring = self.nan_ring
        with self.lock:
            if self.nan_step == step:
                return
            self.nan_step = step
            self.nan_events += 1
            ring.append((step, seq, ring.code(traced.name), ring.code(traced.type_name),
                         self.nan_stage_codes[stage], ring.code(tensor), nans, infs, inputs_finite, self.rank,
                         time.time()))  # fmt: skip
            stop = self.stop_on_nan
            self.stop_on_nan = False
            if stop:
                self.stopped_at = step
        if stop:
            raise NonFiniteError(
                f"probing: {nans} NaN and {infs} Inf in the {stage} {tensor.split(' ')[0]} of {traced.name} "
                f"({traced.type_name}) at step {step}; stopped by `probing nan on --stop`"
            )

    # --- status ----------------------------------------------------------------------------------

    def status(self) -> Dict[str, Any]:
        with self.lock:
            roots = [name for name, ref in self.roots if ref() is not None]
            return {
                "trace": self.trace_on,
                "nan": self.nan_on,
                "stop_on_nan": self.stop_on_nan,
                "stopped_at_step": self.stopped_at,
                "every": self.every,
                "every_auto": self.auto_every,
                "call_cost_us": round(self.call_cost * 1e6, 2),
                "backward": self.backward,
                "modules": self.patterns,
                "depth": self.depth,
                "models": roots,
                "hooked_modules": len(self.traced),
                "hooks": self.hook_count(),
                "optimizers": sorted(name for name, _ in self.optimizers.values()),
                "step": self.step,
                "rows": len(self.ring),
                "capacity": self.ring.capacity,
                "dropped_rows": self.ring.dropped,
                "pending_cuda": len(self.pending_cuda),
                "nan_events": self.nan_events,
                "rank": self.rank,
                "error": self.error or start_error,
            }


def calibrate(torch: Any) -> float:
    """Seconds one traced module call costs here: a hooked nn.Identity against a bare one, with
    a tracer of its own, so that the job's tracing goes on untouched meanwhile."""
    probe = torch.nn.Identity()
    data = torch.zeros(1)
    scratch = Tracer(torch)
    scratch.ring = Ring("calibration", _columns("python.torch_trace"), 1000)
    scratch.tracing_now = scratch.watching = True
    pre, post = scratch._hooks_for(_Traced(probe, "calibration", 0, scratch.ring, False), False)

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


def _columns(table: str) -> List[Tuple[str, str]]:
    from ...schema.tables import AGENT_TABLES as TABLES

    return [(column.name, column.type) for column in TABLES[table].columns]


def _device_of(module: Any) -> Optional[str]:
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return str(tensor.device)
    return None


def _optimizer_on_cuda(optimizer: Any) -> bool:
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            return bool(parameter.is_cuda)
    return False


_tracer: Optional[Tracer] = None
_tracer_lock = threading.Lock()

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
