"""Finding a torch job's models and optimizers, and the names the job knows them by.

Imports torch only when the job already has (`require_torch`). Everything here reads the Python
object graph and module metadata, which the agent's own threads may do (safepoint.py says what
they may not).

A job's models are its top-level modules: every live nn.Module, found by gc, that is no other
found module's child. Each is named after the variable that holds it, looked up in `__main__`
and in the frames of the job's threads, outermost first.
"""

from __future__ import annotations

import gc
import itertools
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple


class NoTorch(Exception):
    """The job has not imported torch; raised to the handler, which says so."""


def require_torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "nn") or "torch.optim.optimizer" not in sys.modules:
        raise NoTorch("this process has not imported torch")
    return torch


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


def device_of(module: Any) -> Optional[str]:
    """The device of a module's first parameter or buffer (metadata only), or None."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return str(tensor.device)
    return None


def optimizer_on_cuda(optimizer: Any) -> bool:
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            return bool(parameter.is_cuda)
    return False
