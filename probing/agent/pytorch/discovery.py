"""Finding a torch job's models and optimizers, and the names the job knows them by.

Imports torch only when the job already has (`require_torch`). Everything here reads the Python
object graph and module metadata, which the agent's own threads may do (safepoint.py says what
they may not).

A job's models are its top-level modules: every live nn.Module, found by gc, that is no other
found module's child. Each is named after the variable that holds it, looked up in `__main__`
and in the frames of the job's threads, outermost first.

gc's objects are listed one generation at a time, each only where its listing would hold the
GIL no longer than a request may (memory/objects.py); where one is left out, instances are also
looked for in what the job's variables reach (`reachable_instances`), and the caller says so.
"""

from __future__ import annotations

import gc
import itertools
import sys
import weakref
from types import CodeType, FrameType, FunctionType, ModuleType
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

from ...originals import allocate_lock, monotonic
from ..imported import imported, importing
from ..memory.objects import GENERATIONS, Skipped, list_generation, release
from ..pacing import MAX_STALL_S, Pacer
from ..stacks import current_frames, outermost_first


class NoTorch(Exception):
    """The job has not imported torch; raised to the handler, which says so."""


def require_torch() -> Any:
    torch = imported("torch")
    if torch is None or not hasattr(torch, "nn") or "torch.optim.optimizer" not in sys.modules:
        if importing("torch"):
            raise NoTorch("this process is importing torch right now: ask again once it has")
        raise NoTorch("this process has not imported torch")
    return torch


def _namespaces(own_threads: Any) -> Iterator[Dict[str, Any]]:
    """Where the job keeps its objects: `__main__`, then the locals of every thread's frames,
    outermost first (the training loop's `model` before a helper's `m`)."""
    main = sys.modules.get("__main__")
    if main is not None:
        yield vars(main)
    for ident, innermost in current_frames().items():
        if ident in own_threads:
            continue
        for outer in outermost_first(innermost):
            try:
                yield outer.f_locals
            except Exception:  # noqa: BLE001 - a frame that cannot show its locals
                continue


def names_of(objects: Sequence[Any], own_threads: Any = ()) -> Dict[int, str]:
    """A readable name for each object: the variable that holds it (`model`), or an attribute
    of such a variable (`trainer.model`, `self.model`), from the first namespace that has either.
    Namespace by namespace, not every variable before every attribute: a training thread inside
    `trainer.model(batch)` has the model as `self` in torch's Module.__call__ frame, a name the
    job never wrote and one that a query sees only when it lands mid-forward."""
    wanted = {id(item) for item in objects}
    names: Dict[int, str] = {}
    for namespace in _namespaces(own_threads):
        if len(names) == len(wanted):
            break
        _name_from(namespace, wanted, names)
    taken: Dict[str, int] = {}
    for item in objects:
        name = names.get(id(item)) or type(item).__name__
        count = taken[name] = taken.get(name, 0) + 1
        names[id(item)] = name if count == 1 else f"{name}#{count}"
    return names


def _name_from(namespace: Dict[str, Any], wanted: Set[int], names: Dict[int, str]) -> None:
    """Name what `wanted` holds that `names` lacks after a variable of `namespace`, then after an
    attribute of one (a variable of the place comes first)."""
    holders: List[Tuple[str, Any]] = []
    for key, value in list(namespace.items()):
        if key.startswith("__"):
            continue
        if id(value) in wanted:
            names.setdefault(id(value), key)
        elif hasattr(value, "__dict__") and not isinstance(value, type) and type(value).__name__ != "module":
            holders.append((key, value))
    for key, holder in holders:
        try:
            attributes = list(vars(holder).items())
        except TypeError:
            continue
        for attribute, value in attributes:
            if id(value) in wanted:
                names.setdefault(id(value), f"{key}.{attribute}")


class Found(NamedTuple):
    """What a search for instances found, and the generations of gc it could not list."""

    items: List[Any]
    skipped: List[Skipped]
    walk_cut: bool = False  # the walk from the job's variables stopped at WALK_MAX_OBJECTS

    def note(self, table: str, what: str) -> Optional[str]:
        """Why nothing may have been found; None once something was (a note on every query of
        a job whose model was found would be noise)."""
        if not self.skipped or self.items:
            return None
        walked = f"the first {WALK_MAX_OBJECTS:,} objects of " if self.walk_cut else ""
        return (
            f"{table}: {what} looked for in gc's younger generations and in {walked}what the job's "
            f"variables reach ({WALK_DEPTH} references deep) only: "
            + "; ".join(why.describe() for why in self.skipped)
        )


def instances_of(cls: type, own_threads: Any = (), bound_s: float = MAX_STALL_S) -> Found:
    """Live objects of a class, by gc. Compared by type, not isinstance: isinstance reads
    `__class__`, which some lazy module proxies answer with a warning on the job's stderr."""
    found: List[Any] = []
    skipped: List[Skipped] = []
    pacer = Pacer()
    for generation in range(GENERATIONS):
        objects, why = list_generation(generation, bound_s)
        if objects is None:
            if why is not None:
                skipped.append(why)
            continue
        pacer.pause()
        for index, item in enumerate(objects):
            if not index & 255:
                pacer.pause_if_due()
            if issubclass(type(item), cls):
                found.append(item)
        item = None
        release(objects, pacer)
    walk_cut = False
    if skipped:
        known = {id(item) for item in found}
        reached, walk_cut = reachable_instances(cls, own_threads, pacer)
        found.extend(item for item in reached if id(item) not in known)
    return Found(found, skipped, walk_cut)


# How far the walk from the job's variables goes: `trainer.model` is three references from
# `trainer` (its values, or its __dict__, then the model), a list of models two.
WALK_DEPTH = 4
# Objects the walk looks at, at most, and the longest container it looks into (asking a
# container for its references is one C call as long as the container).
WALK_MAX_OBJECTS = 200_000
WALK_MAX_CONTAINER = 10_000
_CONTAINERS = (list, tuple, dict, set, frozenset)
# Not looked into: what leads to everything (modules, classes, functions and their globals).
_NOT_WALKED = (type, ModuleType, FunctionType, CodeType, FrameType)
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


def reachable_instances(cls: type, own_threads: Any, pacer: Pacer) -> Tuple[List[Any], bool]:
    """Instances of `cls` that the job's variables (`__main__` and its threads' frames) reach in
    at most WALK_DEPTH references, found with gc.get_referents (no code of the job runs); an
    instance is not looked into. And whether the walk stopped at WALK_MAX_OBJECTS."""
    found: List[Any] = []
    seen = set()
    level: List[Any] = []
    for namespace in _namespaces(own_threads):
        try:
            level.extend(list(namespace.values()))
        except Exception:  # noqa: BLE001 - a frame's locals that cannot be read
            continue
    looked = 0
    for _ in range(WALK_DEPTH + 1):
        following: List[Any] = []
        for item in level:
            looked += 1
            if not looked & 255:
                pacer.pause_if_due()
            if id(item) in seen or looked > WALK_MAX_OBJECTS:
                continue
            seen.add(id(item))
            kind = type(item)
            if issubclass(kind, cls):
                found.append(item)
            elif issubclass(kind, _NOT_WALKED) or not gc.is_tracked(item):
                continue
            elif issubclass(kind, _CONTAINERS):
                # The builtin's own len: a subclass's __len__ is the job's code.
                base = next(base for base in _CONTAINERS if issubclass(kind, base))
                if base.__len__(item) <= WALK_MAX_CONTAINER:
                    following.extend(gc.get_referents(item))
            elif kind.__flags__ & _HEAP_TYPE and not kind.__itemsize__:
                # An instance of a class statement's class: its references are its attributes.
                following.extend(gc.get_referents(item))
        level = following
    return found, looked > WALK_MAX_OBJECTS


def find_roots(torch: Any, own_threads: Any = (), fresh_s: float = 0.0) -> Found:
    """The job's top-level modules, named, as (name, module): every live nn.Module that is no
    other's child.

    With `fresh_s`, a walk made less than that long ago is reused, and callers arriving during
    a walk wait for it: the walk over every object gc tracks is most of a model-table query
    (75 ms on a job of 290 000 objects, in slices), and four clients querying at once made four
    of them.
    """
    global _roots_seen
    if not fresh_s:
        return _walk_roots(torch, own_threads)
    with _roots_lock:
        seen = _roots_seen
        if seen is not None and monotonic() - seen[0] < fresh_s:
            roots = [(name, ref()) for name, ref in seen[1]]
            if all(module is not None for _, module in roots):
                return Found(roots, *seen[2])
        found = _walk_roots(torch, own_threads)
        refs: List[Tuple[str, Callable[[], Any]]] = [
            (name, weakref.ref(module)) for name, module in found.items
        ]
        _roots_seen = (monotonic(), refs, (found.skipped, found.walk_cut))
        return found


_roots_lock = allocate_lock()
_roots_seen: Optional[Tuple[float, List[Tuple[str, Callable[[], Any]]], Tuple[List[Skipped], bool]]] = None


def _walk_roots(torch: Any, own_threads: Any) -> Found:
    module_type = torch.nn.Module
    found = instances_of(module_type, own_threads)
    pacer = Pacer()
    children = set()
    for module in found.items:
        pacer.pause_if_due()
        for child in module.children():
            children.add(id(child))
    roots = [module for module in found.items if id(module) not in children]
    names = names_of(roots, own_threads)
    named = sorted(((names[id(module)], module) for module in roots), key=lambda pair: pair[0])
    return Found(named, found.skipped, found.walk_cut)


def find_optimizers(torch: Any, own_threads: Any = ()) -> Found:
    optimizer_type = torch.optim.Optimizer
    return instances_of(optimizer_type, own_threads)


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
