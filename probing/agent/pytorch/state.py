"""Snapshots of a PyTorch job's state: its modules, live tensors and optimizers.

Read when queried. The module tree and tensor metadata are read from the agent's thread;
gradients, `grad_fn` and tensor values only through `safepoint.read_safely` (in the training
thread at its next optimizer step, or while the job is quiet), and left NULL with a note when
neither comes. Imports torch only when the job already has (discovery.require_torch); with no
torch in the job the tables are empty.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ...originals import perf_counter
from ..columns import TableBuilder
from ..memory.objects import GENERATIONS, Skipped, list_generation, release
from ..pacing import Pacer, stall_bound
from .discovery import (
    Found,
    NoTorch,
    find_optimizers,
    find_roots,
    names_of,
    reachable_instances,
    require_torch,
)
from .safepoint import read_safely
from .tracer import current

# Model-table queries within this long of one another share one search for the job's models.
ROOTS_FRESH_S = 1.0
# python.tensors stops looking at objects after this long, and says so.
DEFAULT_TENSOR_BUDGET_S = 1.0


def _torch_or_none() -> Any:
    try:
        return require_torch()
    except NoTorch:
        return None


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _note(table: str, columns: str, why: str) -> str:
    return (
        f"{table}: {columns} left NULL: {why} (probing reads gradients and tensor values only "
        "between the job's steps; `query --step-wait S` waits longer)"
    )


def module_rows(own_threads: Any, step_wait_s: float) -> Tuple[List[Tuple[Any, ...]], List[str]]:
    torch = _torch_or_none()
    if torch is None:
        return [], []
    tracer = current()
    rows = []
    modules_parameters = []
    roots = find_roots(torch, own_threads, ROOTS_FRESH_S)
    pacer = Pacer()
    for root_name, root in roots.items:
        for name, module in root.named_modules(prefix=root_name):
            pacer.pause_if_due()
            own = list(module.parameters(recurse=False))
            modules_parameters.append(own)
            params = trainable = 0
            first = None
            for parameter in module.parameters():
                count = parameter.numel()
                params += count
                if parameter.requires_grad:
                    trainable += count
                if first is None:
                    first = parameter
            rows.append([
                name, root_name, type(module).__name__, name.count(".") - root_name.count("."),
                params, trainable,
                str(first.device) if first is not None else None,
                _dtype_name(first.dtype) if first is not None else None,
                bool(module.training), None, None,
                tracer is not None and tracer.is_hooked(module),
            ])  # fmt: skip
    notes = [note for note in [roots.note("python.modules", "models")] if note]
    if rows:
        norms, why = read_safely(
            torch, own_threads, lambda: _grad_norms(torch, modules_parameters), step_wait_s
        )
        if norms is None:
            notes.append(_note("python.modules", "grad_norm and has_nonfinite_grad", str(why)))
        else:
            for row, norm in zip(rows, norms):
                row[9] = norm
                row[10] = (not math.isfinite(norm)) if norm is not None else None
    return [tuple(row) for row in rows], notes


def _grad_norms(torch: Any, parameters_per_module: List[List[Any]]) -> List[Optional[float]]:
    """The L2 norm of each module's own parameter gradients, read back in one transfer."""
    grads_per_module = [
        [p.grad for p in parameters if p.grad is not None] for parameters in parameters_per_module
    ]
    flat = [grad for grads in grads_per_module for grad in grads]
    if not flat:
        return [None] * len(grads_per_module)
    with torch.no_grad():
        norms = [grad.detach().float().norm() for grad in flat]
        values = torch.stack([norm.to("cpu") for norm in norms]).tolist()
    result: List[Optional[float]] = []
    index = 0
    for grads in grads_per_module:
        if not grads:
            result.append(None)
            continue
        part = values[index : index + len(grads)]
        index += len(grads)
        result.append(math.sqrt(sum(value * value for value in part)))
    return result


def tensor_rows(
    own_threads: Any, budget_s: float, step_wait_s: float
) -> Tuple[List[Tuple[Any, ...]], List[str]]:
    """Live tensors: parameters, their gradients and buffers of the job's models by name, then
    every other tensor gc can see, until the time budget runs out."""
    torch = _torch_or_none()
    if torch is None:
        return [], []
    started = perf_counter()
    rows: List[List[Any]] = []
    seen: Dict[int, int] = {}  # id of a tensor listed -> its row
    # Tensors gc found, by weak reference: the scan must not keep a step's activations alive
    # while it waits for the next step to read their grad_fn.
    found_rows: Dict[int, Callable[[], Any]] = {}

    def add(tensor: Any, name: Optional[str], kind: str) -> None:
        row = seen.get(id(tensor))
        if row is not None:
            if kind != "gradient":
                return
            ref = found_rows.get(row)
            if ref is not None and ref() is tensor:  # gc found it first, as a tensor: name it
                rows[row][:2] = [name, kind]
                return
            # else: the tensor gc found there died and its id was reused; this is another one
        seen[id(tensor)] = len(rows)
        rows.append([
            name, kind, str(list(tensor.shape)), _dtype_name(tensor.dtype), str(tensor.device),
            tensor.nelement() * tensor.element_size(), bool(tensor.requires_grad),
            isinstance(tensor, torch.nn.Parameter), None,
        ])  # fmt: skip

    pacer = Pacer()
    parameters, notes = _add_named_tensors(torch, own_threads, add, pacer)
    tensor_type = torch.Tensor

    def add_unnamed(item: Any) -> None:
        if id(item) not in seen:
            add(item, None, "tensor")
            try:
                found_rows[len(rows) - 1] = weakref.ref(item)
            except TypeError:  # a tensor subclass without weak references: no grad_fn for it
                pass

    _add_tensors_gc_sees(tensor_type, add_unnamed, own_threads, pacer, started, budget_s, notes)
    _add_autograd_state(torch, own_threads, step_wait_s, parameters, found_rows, rows, add, notes)
    return [tuple(row) for row in rows], notes


_Add = Callable[[Any, Optional[str], str], None]


def _add_named_tensors(
    torch: Any, own_threads: Any, add: _Add, pacer: Pacer
) -> Tuple[List[Tuple[str, Any]], List[str]]:
    """The parameters and buffers of the job's models, by name; the parameters (whose gradients
    are read later) and the notes."""
    parameters: List[Tuple[str, Any]] = []
    roots = find_roots(torch, own_threads, ROOTS_FRESH_S)
    for root_name, root in roots.items:
        for name, parameter in root.named_parameters(prefix=root_name):
            pacer.pause_if_due()
            add(parameter, name, "parameter")
            parameters.append((name, parameter))
        for name, buffer in root.named_buffers(prefix=root_name):
            add(buffer, name, "buffer")
    return parameters, [note for note in [roots.note("python.tensors", "models")] if note]


def _add_tensors_gc_sees(
    tensor_type: Any, add_unnamed: Callable[[Any], None], own_threads: Any, pacer: Pacer,
    started: float, budget_s: float, notes: List[str],
) -> None:  # fmt: skip
    """Every other tensor gc tracks, generation by generation until `budget_s` from `started`
    has passed; then those reachable from the ones a generation too large to list left out."""
    looked = total = 0
    skipped: List[Skipped] = []
    out_of_time = False
    for generation in range(GENERATIONS):
        objects, left_out = list_generation(generation, stall_bound(budget_s))
        if objects is None:
            if left_out is not None:
                skipped.append(left_out)
            continue
        total += len(objects)
        pacer.pause()
        for index, item in enumerate(objects):
            if not index & 255:
                pacer.pause_if_due()
                if perf_counter() - started > budget_s:
                    out_of_time = True
                    break
            looked += 1
            if issubclass(type(item), tensor_type):
                add_unnamed(item)
        item = None
        release(objects, pacer)  # no reference to the job's objects outlives the scan
        if out_of_time:
            notes.append(
                f"python.tensors: stopped after {budget_s:g} s with {looked} of {total} objects looked at; "
                "the tensors listed are a part of them (raise it with `query --scan-budget S`)"
            )
            break
    if skipped and not out_of_time:
        reached, walk_cut = reachable_instances(tensor_type, own_threads, pacer)
        for item in reached:
            add_unnamed(item)
        item = None
        del reached  # no reference to the job's objects outlives the scan
        notes.append(Found([], skipped, walk_cut).note("python.tensors", "other tensors") or "")


def _add_autograd_state(
    torch: Any, own_threads: Any, step_wait_s: float, parameters: List[Tuple[str, Any]],
    found_rows: Dict[int, Callable[[], Any]], rows: List[List[Any]], add: _Add, notes: List[str],
) -> None:  # fmt: skip
    """The parameters' gradients as rows of their own, and the grad_fn of the tensors gc found:
    read in the job's thread between steps (read_safely), or left NULL with a note."""

    def autograd_state() -> Tuple[List[Tuple[str, Any]], List[Tuple[int, Optional[str]]]]:
        grads = [(name + ".grad", parameter.grad) for name, parameter in parameters]
        made_by = []
        for index, ref in found_rows.items():
            tensor = ref()
            grad_fn = tensor.grad_fn if tensor is not None else None
            made_by.append((index, type(grad_fn).__name__ if grad_fn is not None else None))
        return [(name, grad) for name, grad in grads if grad is not None], made_by

    state, why = read_safely(torch, own_threads, autograd_state, step_wait_s)
    if state is None:
        notes.append(_note("python.tensors", "gradients and grad_fn", str(why)))
    else:
        grads, made_by = state
        for index, grad_fn in made_by:
            rows[index][8] = grad_fn
        for name, grad in grads:
            add(grad, name, "gradient")


def optimizer_rows(own_threads: Any, step_wait_s: float) -> Tuple[List[Tuple[Any, ...]], List[str]]:
    torch = _torch_or_none()
    if torch is None:
        return [], []
    found = find_optimizers(torch, own_threads)
    optimizers = found.items
    notes = [note for note in [found.note("python.optimizers", "optimizers")] if note]
    if not optimizers:
        return [], notes
    tracer = current()
    names = names_of(optimizers, own_threads)
    for optimizer in optimizers:
        known = tracer.optimizer_name(optimizer) if tracer is not None else None
        if known is not None:
            names[id(optimizer)] = known
    # Learning rates, betas and step counts may be tensors the step updates in place.
    rows, why = read_safely(
        torch, own_threads, lambda: _optimizer_rows(optimizers, names, _number), step_wait_s
    )
    if rows is not None:
        return rows, notes
    notes.append(_note("python.optimizers", "values held in tensors (lr, betas, steps)", str(why)))
    return _optimizer_rows(optimizers, names, _plain_number), notes


def _optimizer_rows(
    optimizers: List[Any], names: Any, number: Callable[[Any], Optional[float]]
) -> List[Tuple[Any, ...]]:
    rows = []
    for optimizer in optimizers:
        for index, group in enumerate(optimizer.param_groups):
            parameters = list(group.get("params", ()))
            betas = group.get("betas")
            beta1, beta2 = (None, None)
            if isinstance(betas, (tuple, list)) and len(betas) == 2:
                beta1, beta2 = number(betas[0]), number(betas[1])
            steps = None
            for parameter in parameters:
                state = optimizer.state.get(parameter)
                if state and "step" in state:
                    counted = number(state["step"])
                    steps = int(counted) if counted is not None else None
                    break
            rows.append((
                names[id(optimizer)], type(optimizer).__name__, index, number(group.get("lr")),
                number(group.get("momentum")),
                beta1, beta2, number(group.get("weight_decay")), len(parameters),
                sum(parameter.numel() for parameter in parameters), steps,
            ))  # fmt: skip
    return rows


def _plain_number(value: Any) -> Optional[float]:
    """A Python number as float; None for anything else, a tensor included (not read)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _number(value: Any) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)  # a float, or a 0-d tensor (lr may be a tensor)
    except (TypeError, ValueError):
        return None


def fill(builder: TableBuilder, rows: Iterable[Tuple[Any, ...]]) -> TableBuilder:
    for row in rows:
        builder.append(row)
    return builder
