"""Snapshots of a PyTorch job's state: its modules, live tensors and optimizers.

Read when queried, from the agent's thread; nothing is hooked. Imports torch only when the job
already has (torchtrace.require_torch); with no torch in the job the tables are empty.
"""

from __future__ import annotations

import gc
import math
from time import perf_counter
from typing import Any, Iterable, List, Optional, Tuple

from .columns import TableBuilder
from .torchtrace import NoTorch, current, find_optimizers, find_roots, names_of, require_torch

# python.tensors stops looking at objects after this long, and says so.
DEFAULT_TENSOR_BUDGET_S = 1.0


def _torch_or_none() -> Any:
    try:
        return require_torch()
    except NoTorch:
        return None


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def module_rows(own_threads: Any) -> List[Tuple[Any, ...]]:
    torch = _torch_or_none()
    if torch is None:
        return []
    tracer = current()
    traced = tracer.traced if tracer is not None else {}
    rows = []
    for root_name, root in find_roots(torch, own_threads):
        modules = list(root.named_modules(prefix=root_name))
        own_grads = [
            [p.grad for p in module.parameters(recurse=False) if p.grad is not None] for _, module in modules
        ]
        norms = _grad_norms(torch, own_grads)
        for (name, module), norm in zip(modules, norms):
            params = trainable = 0
            first = None
            for parameter in module.parameters():
                count = parameter.numel()
                params += count
                if parameter.requires_grad:
                    trainable += count
                if first is None:
                    first = parameter
            hooked = traced.get(id(module))
            rows.append((
                name, root_name, type(module).__name__, name.count(".") - root_name.count("."),
                params, trainable,
                str(first.device) if first is not None else None,
                _dtype_name(first.dtype) if first is not None else None,
                bool(module.training), norm, (not math.isfinite(norm)) if norm is not None else None,
                hooked is not None and bool(hooked.handles),
            ))  # fmt: skip
    return rows


def _grad_norms(torch: Any, grads_per_module: List[List[Any]]) -> List[Optional[float]]:
    """The L2 norm of each module's own parameter gradients, read back in one transfer."""
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


def tensor_rows(own_threads: Any, budget_s: float) -> Tuple[List[Tuple[Any, ...]], Optional[str]]:
    """Live tensors: parameters, their gradients and buffers of the job's models by name, then
    every other tensor gc can see, until the time budget runs out."""
    torch = _torch_or_none()
    if torch is None:
        return [], None
    started = perf_counter()
    rows: List[Tuple[Any, ...]] = []
    seen = set()

    def add(tensor: Any, name: Optional[str], kind: str) -> None:
        if id(tensor) in seen:
            return
        seen.add(id(tensor))
        grad_fn = tensor.grad_fn
        rows.append((
            name, kind, str(list(tensor.shape)), _dtype_name(tensor.dtype), str(tensor.device),
            tensor.nelement() * tensor.element_size(), bool(tensor.requires_grad),
            isinstance(tensor, torch.nn.Parameter), type(grad_fn).__name__ if grad_fn is not None else None,
        ))  # fmt: skip

    for root_name, root in find_roots(torch, own_threads):
        for name, parameter in root.named_parameters(prefix=root_name):
            add(parameter, name, "parameter")
            if parameter.grad is not None:
                add(parameter.grad, name + ".grad", "gradient")
        for name, buffer in root.named_buffers(prefix=root_name):
            add(buffer, name, "buffer")
    looked = total = 0
    note = None
    tensor_type = torch.Tensor
    objects = gc.get_objects()
    total = len(objects)
    for looked, item in enumerate(objects, 1):
        if issubclass(type(item), tensor_type):
            add(item, None, "tensor")
        if looked % 4096 == 0 and perf_counter() - started > budget_s:
            note = (
                f"python.tensors: stopped after {budget_s:g} s with {looked} of {total} objects looked at; "
                "the tensors listed are a part of them (raise it with `query --scan-budget S`)"
            )
            break
    del objects
    return rows, note


def optimizer_rows(own_threads: Any) -> List[Tuple[Any, ...]]:
    torch = _torch_or_none()
    if torch is None:
        return []
    optimizers = find_optimizers(torch)
    tracer = current()
    names = names_of(optimizers, own_threads)
    rows = []
    for optimizer in optimizers:
        known = tracer.optimizers.get(optimizer) if tracer is not None else None
        name = known[0] if known is not None else names[id(optimizer)]
        for index, group in enumerate(optimizer.param_groups):
            parameters = list(group.get("params", ()))
            betas = group.get("betas")
            beta1, beta2 = (
                (_number(betas[0]), _number(betas[1])) if isinstance(betas, (tuple, list)) else (None, None)
            )
            steps = None
            for parameter in parameters:
                state = optimizer.state.get(parameter)
                if state and "step" in state:
                    steps = int(_number(state["step"]) or 0)
                    break
            rows.append((
                name, type(optimizer).__name__, index, _number(group.get("lr")),
                _number(group.get("momentum")),
                beta1, beta2, _number(group.get("weight_decay")), len(parameters),
                sum(parameter.numel() for parameter in parameters), steps,
            ))  # fmt: skip
    return rows


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
