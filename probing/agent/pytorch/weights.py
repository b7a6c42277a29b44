"""Whether a model's parameters and buffers are finite: checked when NaN checks begin, and for
the module of each NaN/Inf event (nonfinite.py).

`nan on` is usually typed after the loss went NaN. By then an optimizer step has often written
NaN into the weights, and every later step's first NaN is made by whichever module runs first
with finite inputs and NaN weights: blaming it for "making" the NaN points away from the cause,
which lies before the checks began. So the weights are checked too: all of them when the checks
begin (`WeightsAtStart`), and those of the blamed module at each event (`module_weights`).

Values are read in the training thread only (DESIGN.md, "Agent rules"), at a module boundary:
the hooks' forward pre-hook runs the start check, the event's own hook the module's check. No
optimizer update or backward pass is under way in that thread there, so no weight is being
written as it is read. One reduction per floating tensor, a module's read at once (ledger.py);
counts only for a tensor that is not finite.

"Already when checks began" is told from torch's version counters, read (metadata only) when a
model is queued: a non-finite tensor whose counter has not moved since was so then, whenever the
check reads it. One whose counter moved (an update wrote it since) counts as already only while
no NaN/Inf has been seen since the checks began: an update writes NaN from a NaN gradient or
loss, which the checks would have seen first. Otherwise whether it was is not known, and the
check says so.

A model of many parameters is not checked in one go: the start check works for at most
SLICE_S at a call, and only once the job has run DUTY_SHARE_INVERSE times as long as the
check took (so it takes at most a tenth of the training thread's time), over as many steps as
it needs; a module's check at an event stops after SLICE_S and says it was cut. A piece is
measured in the training thread's CPU time: on a loaded machine the thread may wait for a core
in the middle of one, which is no work of the check's (counted on the wall clock, such a wait
once spread a five-tensor model's check over several steps, and updates in between made
"already" unknowable); the wait after it is on the wall clock, as the job runs.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

from ...originals import Event, perf_counter, thread_time
from ..pacing import MAX_STALL_S
from .finite import describe_tensor, nonfinite
from .ledger import finite

# The longest one piece of weight checking holds the training thread.
SLICE_S = MAX_STALL_S
# A piece ends past SLICE_S of the thread's CPU time, or this many SLICE_S on the wall clock.
WALL_SLICES = 5
# After a piece of the start check that took t, the next waits (DUTY_SHARE_INVERSE - 1) * t.
DUTY_SHARE_INVERSE = 10
# Non-finite tensors named in `nan status` (all are counted).
MAX_FINDINGS = 32
# Non-finite weight names kept for one event (the rest are counted).
MAX_EVENT_NAMES = 8

# (qualified name, module name, 'parameter' or 'buffer', tensor)
Named = Tuple[str, str, str, Any]


def readable(tensor: Any, torch: Any) -> Optional[Any]:
    """The tensor whose values a check may read, or None to leave it unchecked.

    A DTensor's own reduction is a collective: run on one rank from a hook, the others never
    join it and the job hangs; its local shard is read instead. Any other tensor subclass may
    dispatch anywhere, so only plain tensors and parameters are read. FSDP frees the storage of
    resharded parameters (their views keep their shape): nothing to read there; nor in a meta
    tensor or a lazy module's uninitialised parameter.
    """
    local = getattr(tensor, "_local_tensor", None)
    if local is not None:
        tensor = local
    if type(tensor) is not torch.Tensor and type(tensor) is not torch.nn.Parameter:
        return None
    if not tensor.is_floating_point() or tensor.numel() == 0 or tensor.device.type == "meta":
        return None
    storage = getattr(tensor, "untyped_storage", None)
    if storage is not None and storage().nbytes() == 0:
        return None
    return tensor


def own_tensors(module: Any, prefix: str) -> Iterator[Named]:
    """A module's own parameters and buffers (not its children's), with qualified names."""
    for kind, table in (("parameter", module._parameters), ("buffer", module._buffers)):
        for name, tensor in list(table.items()):
            if tensor is not None:
                yield (f"{prefix}.{name}" if prefix else name), prefix, kind, tensor


def version_of(tensor: Any) -> Optional[int]:
    """A tensor's version counter (in-place writes move it), or None where it keeps none."""
    try:
        return int(tensor._version)
    except Exception:  # noqa: BLE001 - an inference tensor keeps no version counter
        return None


def check_tensor(tensor: Any, torch: Any) -> Optional[Tuple[int, int]]:
    """(NaN count, Inf count) of a tensor that is not finite; None when it is, or cannot be read."""
    data = readable(tensor, torch)
    if data is None:
        return None
    found = nonfinite([data], torch)
    return None if found is None else (found[1], found[2])


class EventWeights:
    """What the check of one blamed module's weights found."""

    __slots__ = ("finite", "names", "count", "unwritten")

    def __init__(self, finite: Optional[bool], names: List[str], count: int, unwritten: bool = False) -> None:
        self.finite = finite  # None: cut short before any was found, so not known
        self.names = names  # the first non-finite ones
        self.count = count  # how many were not finite
        self.unwritten = unwritten  # one of them was not written since the checks began


def module_weights(
    module: Any, name: str, torch: Any, hooked: Callable[[Any], bool], unwritten: Callable[[Any], bool]
) -> EventWeights:
    """The weights of `module` at an event, in the training thread: its own parameters and
    buffers, and those of its children that are not hooked. A hooked child is left out: its
    output was finite (or it would have been the event), and its weights are its own check.
    Stops after SLICE_S, and says so (finite None, or False with what it found by then)."""
    deadline = thread_time() + SLICE_S
    found = EventWeights(True, [], 0)
    stack = [(name, module)]
    while stack:
        prefix, current = stack.pop()
        own = [
            (qualified, tensor, readable(tensor, torch))
            for qualified, _, _, tensor in own_tensors(current, prefix)
        ]
        own = [entry for entry in own if entry[2] is not None]
        for (qualified, tensor, _), good in zip(own, finite([data for _, _, data in own], torch)):
            if not good:
                found.count += 1
                found.unwritten = found.unwritten or unwritten(tensor)
                if len(found.names) < MAX_EVENT_NAMES:
                    found.names.append(qualified)
        if thread_time() >= deadline and stack:
            found.finite = False if found.count else None
            return found
        for child_name, child in reversed(list(current._modules.items())):
            if child is not None and not hooked(child):
                stack.append((f"{prefix}.{child_name}" if prefix else child_name, child))
    found.finite = found.count == 0
    return found


class Finding:
    """A parameter or buffer that was not finite when the start check read it."""

    __slots__ = ("name", "module", "kind", "tensor", "nan_count", "inf_count", "step", "already")

    def __init__(self, named: Named, counts: Tuple[int, int], step: int, already: bool) -> None:
        self.name, self.module, self.kind = named[0], named[1], named[2]
        self.tensor = describe_tensor(named[3])
        self.nan_count, self.inf_count = counts
        self.step = step
        self.already = already  # so when the checks began (False: not known, written since)

    def fields(self) -> Dict[str, Any]:
        return {"name": self.name, "module": self.module, "kind": self.kind, "tensor": self.tensor,
                "nan_count": self.nan_count, "inf_count": self.inf_count, "step": self.step,
                "already": self.already}  # fmt: skip


class WeightsAtStart:
    """The check of every parameter and buffer of the job's models that a session of NaN checks
    begins with. Made by the agent's thread (`nan on`) or the job's (PROBING_NAN); `work` runs
    in the training thread; `summary` is read from the agent's thread."""

    def __init__(self, torch: Any, began_step: int) -> None:
        self.torch = torch
        self.began_step = began_step
        self.first_step: Optional[int] = None  # the step of its first piece
        self.done_step: Optional[int] = None  # the step it finished at (None: not finished)
        self.pending: List[Tuple[str, Any]] = []  # (name, weakref) of models still to check
        self.covered: Set[int] = set()  # ids of the models queued so far
        self.modules: List[Tuple[str, Any]] = []  # the model being checked: its modules, in order
        self.next_module = 0
        self.seen: Set[int] = set()  # ids of tensors checked (a tensor shared by two modules once)
        self.checked = 0
        self.skipped = 0  # tensors that cannot be read (not floating, freed, a DTensor shard elsewhere)
        self.findings: List[Finding] = []
        self.nonfinite: Dict[str, bool] = {}  # every non-finite tensor's name: whether already so
        self.versions: Dict[int, int] = {}  # id of each tensor queued: its version counter then
        self.event_seen = False  # a NaN/Inf was seen since the checks began (nonfinite.py sets it)
        self.next_at = 0.0
        self.error: Optional[str] = None
        self.finished = Event()

    @property
    def due(self) -> bool:
        return bool(self.pending or self.modules)

    def cover(self, name: str, root: Any) -> None:
        """Queue a model (agent's thread, or the training thread at discovery)."""
        if id(root) in self.covered:
            return
        self.covered.add(id(root))
        for module in root.modules():
            for _, _, _, tensor in own_tensors(module, ""):
                version = version_of(tensor)
                if version is not None:
                    self.versions.setdefault(id(tensor), version)
        self.pending.append((name, weakref.ref(root)))
        self.done_step = None
        self.finished.clear()

    def work(self, step: int) -> None:
        """A piece of the check, in the training thread at a module boundary: at most SLICE_S,
        and nothing until the job has run on for DUTY_SHARE_INVERSE - 1 times the last piece."""
        if perf_counter() < self.next_at:
            return
        started, began = thread_time(), perf_counter()
        if self.first_step is None:
            self.first_step = step
        deadline = started + SLICE_S
        # Waits the CPU clock does not see (a device's sync that sleeps) are bounded too.
        wall_deadline = began + WALL_SLICES * SLICE_S
        try:
            while thread_time() < deadline and perf_counter() < wall_deadline:
                if self.next_module >= len(self.modules):
                    self.modules, self.next_module = [], 0
                    if not self.pending:
                        self.done_step = step
                        self.finished.set()
                        break
                    name, ref = self.pending.pop(0)
                    root = ref()
                    if root is not None:
                        self.modules = list(root.named_modules(prefix=name))
                    continue
                prefix, module = self.modules[self.next_module]
                self.next_module += 1
                self._check(list(own_tensors(module, prefix)), step)
        except Exception as error:  # noqa: BLE001 - a model changed under the check: say so, stop
            self.error = f"{type(error).__name__}: {error}"
            self.pending, self.modules = [], []
            self.done_step = step
            self.finished.set()
        self.next_at = perf_counter() + (DUTY_SHARE_INVERSE - 1) * (thread_time() - started)

    def _check(self, tensors: List[Named], step: int) -> None:
        """A module's own tensors, read at once (ledger.finite); counted where not finite."""
        kept, data = [], []
        for named in tensors:
            if id(named[3]) in self.seen:
                continue
            self.seen.add(id(named[3]))
            readable_data = readable(named[3], self.torch)
            if readable_data is None:
                self.skipped += 1
            else:
                kept.append(named)
                data.append(readable_data)
        self.checked += len(kept)
        for named, good in zip(kept, finite(data, self.torch)):
            counts = None if good else check_tensor(named[3], self.torch)
            if counts is None:
                continue
            already = self.unwritten(named[3]) or not self.event_seen
            self.nonfinite[named[0]] = already
            if len(self.findings) < MAX_FINDINGS:
                self.findings.append(Finding(named, counts, step, already))

    def unwritten(self, tensor: Any) -> bool:
        """Whether nothing wrote into a queued tensor since the checks began (its version)."""
        version = self.versions.get(id(tensor))
        return version is not None and version_of(tensor) == version

    def already(self, weights: EventWeights) -> Optional[bool]:
        """Whether an event's non-finite weights were so when checks began: True when one of
        them was not written since, or the start check found one so; False when the start check
        read them finite (they went NaN/Inf since); None when not known: it has not read them
        yet, or read them NaN/Inf only after an update and a NaN (or when they are finite)."""
        if weights.finite is not False:
            return None if weights.finite is None else False
        if weights.unwritten:
            return True
        found = [self.nonfinite[name] for name in weights.names if name in self.nonfinite]
        if any(found):
            return True
        if found or self.done_step is None:
            return None
        return False

    def summary(self) -> Dict[str, Any]:
        """For `nan status`: how far the check got and what it found."""
        if self.done_step is not None:
            state = "done"
        elif self.first_step is None:
            state = "waiting"  # no hooked module has been called since checks began
        else:
            state = "checking"
        modules: List[str] = []  # those whose weights were NaN/Inf when the checks began
        for finding in self.findings:
            if finding.already and finding.module not in modules:
                modules.append(finding.module)
        return {
            "state": state,
            "began_step": self.began_step,
            "first_step": self.first_step,
            "done_step": self.done_step,
            "checked": self.checked,
            "skipped": self.skipped,
            "nonfinite_count": len(self.nonfinite),
            "already_count": sum(self.nonfinite.values()),
            "nonfinite": [finding.fields() for finding in self.findings],
            "modules": modules,
            "error": self.error,
        }
