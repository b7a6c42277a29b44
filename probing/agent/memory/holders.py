"""What holds a tensor: a path from the job's variables to it, written as the job would write
it (`__main__.history[17]`, `__main__.trainer.cache['x']`, `train.<locals>.batch`).

A breadth-first walk from the job's namespaces (`__main__`, the locals of its threads' frames,
outermost first, then its own modules: job_code.py) through containers (dict, list, tuple,
deque, set) and instances of classes made by class statements (their `__dict__` and slots), so
the first path found to an object is a shortest one. An nn.Module's children, parameters and
buffers are named as torch names them (`model.0.weight`). References are followed with the
interpreter's own C accessors (`dict.items`, slicing, the `__dict__` and slot descriptors
found in the class's own namespace): no `__getattr__`, `__iter__` or `__len__` of the job runs.
Tensors are matched, never looked into, and nothing reads their data.

Bounded by a time budget, a number of objects and a depth; it runs in slices (pacing.py), and a
big container is copied a slice at a time, so the job's threads get the GIL every few
milliseconds. Where it stops before finding every object asked for, `Holders.cut` says why.
Paths are as the walk saw them: a job that moves its objects meanwhile may be seen part before,
part after.
"""

from __future__ import annotations

import gc
import sys
from collections import deque
from itertools import islice
from types import CodeType, FrameType, FunctionType, ModuleType
from typing import Any, Callable, Dict, Hashable, Iterator, List, NamedTuple, Optional, Set, Tuple

from ...originals import perf_counter
from ..imported import imported
from ..pacing import Pacer
from ..stacks import current_frames, outermost_first
from .job_code import AGENT_PREFIX, is_library, library_roots
from .objects import release

MAX_OBJECTS = 500_000  # objects looked at, at most
MAX_DEPTH = 12  # references from a variable
CHUNK = 2048  # a container's items copied in one go (one C call)
MAX_JOB_MODULES = 200
KEY_TEXT = 40  # characters of a dict's key shown in a path
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement
# Not looked into: what leads to everything (modules, classes, functions and their globals).
_NOT_WALKED = (type, ModuleType, FunctionType, CodeType, FrameType)
# An nn.Module keeps its children, parameters and buffers in these dicts.
_MODULE_DICTS = ("_modules", "_parameters", "_buffers")
# The interpreter's own descriptors: a class's namespace, and the kinds of descriptor that are C.
_TYPE_NAMESPACE = type.__dict__["__dict__"]
_MRO = type.__dict__["__mro__"]
_GETSET = type(_TYPE_NAMESPACE)
_MEMBER = type(type.__dict__["__basicsize__"])
_MODULE_NAMESPACE: Any = vars(ModuleType)["__dict__"]
# A level's entries: the object, the path node it hangs from, the step from there to it.
Entry = Tuple[Any, int, str]
# A level's entries cost little to free (a tuple and a reference each).
_ENTRY_FREE_S = 2e-7


class Holders(NamedTuple):
    """key -> (what holds it, the path to it) for each object found; how many objects were looked
    at; and why the walk stopped before finding them all ('time', 'objects', 'depth'), or None
    when it found them all or looked at everything the job's variables reach."""

    found: Dict[Any, Tuple[str, str]]
    looked: int
    cut: Optional[str]

    def stopped(self, budget_s: float) -> str:
        """Why the walk stopped before finding them all, in words."""
        if self.cut == "time":
            return f"its {budget_s:g} s ran out"
        if self.cut == "objects":
            return f"after {self.looked:,} objects"
        return "at its depth"


def find_holders(
    match: Callable[[Any], Optional[Hashable]], wanted: int, budget_s: float, pacer: Pacer
) -> Holders:
    """A path to each tensor for which `match(tensor)` gives a key, until `wanted` keys are found
    or a bound is reached. `match` is called in this thread, once per tensor met: it may read
    metadata only."""
    torch = imported("torch")
    tensor_type = getattr(torch, "Tensor", None)
    if not isinstance(tensor_type, type) or wanted <= 0:
        return Holders({}, 0, None)
    module = getattr(sys.modules.get("torch.nn.modules.module"), "Module", None)
    walk = _Walk(match, wanted, tensor_type, module if isinstance(module, type) else None, budget_s, pacer)
    return walk.run()


class _Walk:
    def __init__(
        self,
        match: Callable[[Any], Optional[Hashable]],
        wanted: int,
        tensor_type: type,
        module_type: Optional[type],
        budget_s: float,
        pacer: Pacer,
    ) -> None:
        self.match = match
        self.wanted = wanted
        self.tensor_type = tensor_type
        self.module_type = module_type
        self.deadline = perf_counter() + budget_s
        self.pacer = pacer
        # The path so far: node -> its parent node (-1: none) and the step from there.
        self.parents: List[int] = []
        self.steps: List[str] = []
        self.seen: Set[int] = set()
        self.found: Dict[Hashable, Tuple[str, str]] = {}
        self.looked = 0
        self.cut: Optional[str] = None
        self.layouts: Dict[type, Tuple[Any, List[Tuple[str, Any]]]] = {}

    def run(self) -> Holders:
        level = self.roots()
        for _ in range(MAX_DEPTH + 1):
            following: List[Entry] = []
            for index, (item, parent, step) in enumerate(level):
                if not index & 15:
                    # A visit copies at most CHUNK references: sixteen stay well within a slice.
                    self.pacer.pause_if_due()
                    if self.looked + len(following) > MAX_OBJECTS:
                        self.cut = "objects"
                    if self.out_of_bounds():
                        break
                self.visit(item, parent, step, following)
                if len(self.found) >= self.wanted:
                    break
            item = None
            release(level, self.pacer, _ENTRY_FREE_S)
            level = following
            if not level or self.cut is not None or len(self.found) >= self.wanted:
                break
        else:
            self.cut = self.cut or "depth"
        release(level, self.pacer, _ENTRY_FREE_S)  # no reference to the job's objects outlives the walk
        done = len(self.found) >= self.wanted
        return Holders(self.found, self.looked, None if done else self.cut)

    def out_of_bounds(self) -> bool:
        if self.cut is None:
            if self.looked > MAX_OBJECTS:
                self.cut = "objects"
            elif perf_counter() > self.deadline:
                self.cut = "time"
        return self.cut is not None

    def node(self, parent: int, step: str) -> int:
        self.parents.append(parent)
        self.steps.append(step)
        return len(self.steps) - 1

    def path(self, node: int) -> str:
        steps = []
        while node >= 0:
            steps.append(self.steps[node])
            node = self.parents[node]
        return "".join(reversed(steps))

    def roots(self) -> List[Entry]:
        level: List[Entry] = []
        for name, namespace in _namespaces():
            if id(namespace) in self.seen:  # a module's top-level frame: its locals are its globals
                continue
            self.seen.add(id(namespace))
            node = self.node(-1, name)
            try:
                items = list(namespace.items())
            except Exception:  # noqa: BLE001 - a frame whose locals cannot be read
                continue
            level.extend((value, node, f".{key}") for key, value in items if not str(key).startswith("__"))
            self.pacer.pause_if_due()
        return level

    def visit(self, item: Any, parent: int, step: str, following: List[Entry]) -> None:
        self.looked += 1
        ident = id(item)
        if ident in self.seen:
            return
        kind = type(item)
        if issubclass(kind, self.tensor_type):
            self.seen.add(ident)
            key = self.match(item)
            if key is not None and key not in self.found:
                holder = self.path(parent)
                self.found[key] = (holder, holder + step)
            return
        if issubclass(kind, _NOT_WALKED) or not gc.is_tracked(item):
            return
        self.seen.add(ident)
        if issubclass(kind, dict):
            self.items(item, self.node(parent, step), following, False)
        elif issubclass(kind, (list, tuple)):
            self.sequence(item, kind, self.node(parent, step), following)
        elif issubclass(kind, deque):
            # gc.get_referents gives a deque's items in order, without its (the job's) __iter__.
            if deque.__len__(item) <= CHUNK:
                node = self.node(parent, step)
                following.extend(
                    (child, node, f"[{index}]") for index, child in enumerate(gc.get_referents(item))
                )
        elif issubclass(kind, (set, frozenset)):
            if (set.__len__ if issubclass(kind, set) else frozenset.__len__)(item) <= CHUNK:
                node = self.node(parent, step)
                following.extend((child, node, "{}") for child in gc.get_referents(item))
        elif kind.__flags__ & _HEAP_TYPE and not kind.__itemsize__:
            self.instance(item, kind, self.node(parent, step), following)

    def items(self, mapping: Dict[Any, Any], node: int, following: List[Entry], attributes: bool) -> None:
        """A dict's values, a slice at a time; `attributes`: named `.key` (an nn.Module's
        children, parameters and buffers) rather than `['key']`."""
        view = dict.items(mapping)
        if dict.__len__(mapping) <= CHUNK:
            parts: Iterator[List[Tuple[Any, Any]]] = iter([list(view)])
        else:
            parts = _slices(view, self)
        for part in parts:
            for key, value in part:
                step = f".{key}" if attributes and type(key) is str else _key_step(key)
                following.append((value, node, step))

    def sequence(self, items: Any, kind: type, node: int, following: List[Entry]) -> None:
        base = list if issubclass(kind, list) else tuple
        fields = _class_attribute(kind, "_fields") if base is tuple else None  # a namedtuple
        length = base.__len__(items)
        for start in range(0, length, CHUNK):
            if start:
                self.pacer.pause_if_due()
                if self.out_of_bounds():
                    return
            part = base.__getitem__(items, slice(start, start + CHUNK))
            for offset, child in enumerate(part):
                index = start + offset
                named = isinstance(fields, tuple) and index < len(fields) and type(fields[index]) is str
                following.append((child, node, f".{fields[index]}" if named else f"[{index}]"))  # type: ignore[index]
            if self.looked + len(following) > MAX_OBJECTS:
                return

    def instance(self, item: Any, kind: type, node: int, following: List[Entry]) -> None:
        namespace_descriptor, slots = self.layout(kind)
        if namespace_descriptor is not None:
            try:
                namespace = namespace_descriptor.__get__(item, kind)
            except Exception:  # noqa: BLE001
                namespace = None
            if type(namespace) is dict:
                self.seen.add(id(namespace))
                module = self.module_type is not None and issubclass(kind, self.module_type)
                for name, value in list(dict.items(namespace))[:CHUNK]:
                    if (
                        module
                        and name in _MODULE_DICTS
                        and type(value) is dict
                        and id(value) not in self.seen
                    ):
                        # `model.0.weight`, as torch names it, not `model._modules['0']._parameters['weight']`
                        self.seen.add(id(value))
                        self.items(value, node, following, True)
                    else:
                        following.append((value, node, f".{name}" if type(name) is str else _key_step(name)))
        for name, descriptor in slots:
            try:
                value = descriptor.__get__(item, kind)
            except Exception:  # noqa: BLE001 - a slot not set
                continue
            following.append((value, node, f".{name}"))

    def layout(self, kind: type) -> Tuple[Any, List[Tuple[str, Any]]]:
        """The interpreter's own `__dict__` descriptor for instances of `kind` (None where a class
        defines `__dict__` in Python, or none has one), and its slots' descriptors."""
        known = self.layouts.get(kind)
        if known is not None:
            return known
        namespace_descriptor = None
        decided = False
        slots: List[Tuple[str, Any]] = []
        for klass in _MRO.__get__(kind):
            namespace = _TYPE_NAMESPACE.__get__(klass)
            for name, value in list(namespace.items()):
                if type(value) is _MEMBER and type(name) is str:
                    slots.append((name, value))
            if not decided and "__dict__" in namespace:
                decided = True
                found = namespace["__dict__"]
                namespace_descriptor = found if type(found) is _GETSET else None
        known = self.layouts[kind] = (namespace_descriptor, slots)
        return known


def _slices(view: Any, walk: _Walk) -> Iterator[List[Tuple[Any, Any]]]:
    """A big dict's items, CHUNK at a time, the job's threads running between two; ends early
    when the job changes the dict meanwhile or the walk is out of bounds."""
    iterator = iter(view)
    while True:
        try:
            part = list(islice(iterator, CHUNK))
        except RuntimeError:  # the dict changed size while the job ran: what was seen stands
            return
        if not part:
            return
        yield part
        walk.pacer.pause_if_due()
        if walk.out_of_bounds():
            return


def _key_step(key: Any) -> str:
    kind = type(key)
    if kind is str:
        return f"[{key!r}]" if len(key) <= KEY_TEXT else f"[{key[:KEY_TEXT]!r}...]"
    if kind is bool or (kind is int and -(10**12) < key < 10**12):
        return f"[{key}]"
    name = _class_attribute(kind, "__name__")
    return f"[<{name if isinstance(name, str) else '?'}>]"


def _class_attribute(kind: type, name: str) -> Any:
    """A class's own attribute, read from its namespaces along the MRO (no metaclass runs)."""
    if name == "__name__":
        return type.__dict__["__name__"].__get__(kind)
    for klass in _MRO.__get__(kind):
        namespace = _TYPE_NAMESPACE.__get__(klass)
        if name in namespace:
            return namespace[name]
    return None


def _namespaces() -> Iterator[Tuple[str, Any]]:
    """(name, namespace): `__main__`, the locals of the job's threads' frames (outermost first;
    none of the agent's), then the job's own modules."""
    main = sys.modules.get("__main__")
    if main is not None and issubclass(type(main), ModuleType):
        yield "__main__", _MODULE_NAMESPACE.__get__(main)
    for innermost in current_frames().values():
        for outer in outermost_first(innermost):
            code = outer.f_code
            if code.co_filename.startswith(AGENT_PREFIX):
                continue
            try:
                local_names = outer.f_locals
            except Exception:  # noqa: BLE001 - a frame that cannot show its locals
                continue
            yield f"{getattr(code, 'co_qualname', code.co_name)}.<locals>", local_names
    roots = library_roots()
    modules = 0
    for name, module in list(sys.modules.items()):
        if name == "__main__" or module is None or not issubclass(type(module), ModuleType):
            continue
        namespace = _MODULE_NAMESPACE.__get__(module)
        file = namespace.get("__file__") if type(namespace) is dict else None
        if not isinstance(file, str) or is_library(file, roots):
            continue
        yield name, namespace
        modules += 1
        if modules >= MAX_JOB_MODULES:
            return
