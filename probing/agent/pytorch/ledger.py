"""The NaN checks of one step, reduced on the device as the step runs and read once at its end.

Forward: each module's output and inputs. Backward: the gradient that arrives at each module's
output (a pre-hook on the autograd node that made it, one per module and step, no walk of the
graph): a NaN made in module M's backward pass first shows in the gradient arriving at the
output of the module that fed M, while the gradient arriving at M's own output was finite. So
the finding is M, the consumer of that output whose own gradient was finite (its inputs are
known by identity from the forward checks); where the output fed no checked module (an
operation between modules took it), the module whose gradient was checked just before. Last,
the parameters' gradients, when the step ends: one that is not finite while every gradient
between modules was (an overflow in a weight's gradient alone) is blamed on its module, the
last such in the model's order.

Each tensor is reduced on its own device to values that are finite exactly when every element
is: on the CPU its min and max (`aminmax`), at once; on CUDA its largest magnitude, through which
a NaN propagates, for BATCH tensors at a time (`torch._foreach_norm(..., inf)`, a launch or two
for the lot, where one a tensor would cost a launch each). The tensors wait for it in a list,
at most BATCH_BYTES of them, and no longer than the next call of a module that writes its
input in place (`inplace=True`, hooks.py) or the step's end; one written in place meanwhile
by anything else (its version counter moved) is left unread rather than read as it is now.
Gradients wait too: where a held gradient is itself a parameter's whole gradient (`x + bias`,
no broadcast), autograd copies it rather than take it as `.grad` (it is referenced). A
tensor met again in the step (a container's output is its last child's; a module's input, the
output before) is reduced once: found by identity, through a weak reference (a tensor freed and
a new one made at its address are never mistaken) and its version counter (an in-place write,
as `ReLU(inplace=True)` makes, moves it: then it is reduced again). Nothing is read in a hook, so
the step's kernels are never waited for there. `settle` reads the step's values in one copy per
device, before the optimizer's update (hooks.py), and names the step's first finding: the first
forward check in call order whose output was not finite, else the backward one above.

As each tensor is reduced to one value, there is no count: a finding says whether its tensor
held a NaN (then neither count is known) or only Infs (no NaN, the Infs uncounted).
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Set, Tuple

# Values held for one step (two per tensor on the CPU, one on CUDA, where each takes a 512-byte
# block of the caching allocator: 25 MB at most); checks past them in that step are not made.
MAX_VALUES = 50_000
INF = float("inf")
# CUDA tensors reduced together, and the most bytes they may hold meanwhile: a 60-module
# transformer's step checks ~200 tensors, reduced in one or two launches.
BATCH = 256
BATCH_BYTES = 64 << 20

Place = Tuple[Any, int]  # (device, index among that device's values)


class Check:
    """A module's call in the step: where its values are, what its outputs were, and which
    checked calls took them as inputs."""

    __slots__ = ("traced", "step", "seq", "described", "outputs", "inputs", "consumers", "grad_finite")

    def __init__(self, traced: Any, step: int, seq: int) -> None:
        self.traced = traced
        self.step = step
        self.seq = seq
        self.described: List[Tuple[Any, ...]] = []  # (name, dtype, shape, device) of each output
        self.outputs: List[List[Place]] = []
        self.inputs: List[Place] = []
        # (check, input index, description of the tensor) of each call that took an output
        self.consumers: List[Tuple[Check, int, Tuple[Any, ...]]] = []
        self.grad_finite = False  # the gradient arriving at its output was read finite


class Owner:
    """The module a parameter belongs to, standing in for a checked call in a finding."""

    __slots__ = ("module", "name", "type_name")

    def __init__(self, module: Any, name: str) -> None:
        self.module = weakref.ref(module)
        self.name = name
        self.type_name = type(module).__name__


def parameters_of(name: str, root: Any, seen: Set[int]) -> List[Tuple[Owner, str, Any]]:
    """(owning module, qualified name, weak reference) of each trainable parameter of a model
    not in `seen` (ids, which it joins)."""
    found = []
    for prefix, module in root.named_modules(prefix=name):
        owner = None
        for short, parameter in list(module._parameters.items()):
            if parameter is None or not parameter.requires_grad or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            owner = owner or Owner(module, prefix)
            found.append((owner, f"{prefix}.{short}", weakref.ref(parameter)))
    return found


class Finding:
    """The step's first non-finite value: whose, which tensor, and what it held."""

    __slots__ = ("check", "stage", "tensor", "nan", "inputs_finite")

    def __init__(self, check: Check, stage: str, tensor: str, nan: bool, inputs_finite: bool) -> None:
        self.check = check
        self.stage = stage
        self.tensor = tensor
        self.nan = nan  # it held a NaN; False: Infs and no NaN
        self.inputs_finite = inputs_finite


def plain(tensor: Any, torch: Any) -> Optional[Any]:
    """The tensor a check reduces, or None to leave it: a floating, non-empty plain tensor (a
    DTensor's local shard: its own reduction would be a collective one rank makes alone)."""
    kind = type(tensor)
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        # Looked for only here: on a plain tensor the attribute's absence costs an exception.
        tensor = getattr(tensor, "_local_tensor", None)
        kind = type(tensor)
        if kind is not torch.Tensor and kind is not torch.nn.Parameter:
            return None
    if not tensor.is_floating_point() or tensor.numel() == 0 or tensor.is_meta:
        return None
    return tensor


def described(name: Tuple[Any, ...]) -> str:
    label, dtype, shape, device = name
    return f"{label} {str(dtype).replace('torch.', '')}{list(shape)} on {device}"


def finite(tensors: List[Any], torch: Any) -> List[bool]:
    """Whether each of some plain tensors is finite, read at once: one copy per device."""
    ledger = StepLedger(torch)
    places = [ledger.reduce(tensor) for tensor in tensors]
    if ledger.batched:
        ledger.flush()
    read = {device: torch.stack(held).tolist() for device, held in ledger.values.items()}
    return [_finite(read, own) for own in places]


def _holds_nan(read: Dict[Any, List[float]], places: List[Place]) -> bool:
    return any(read[device][index] != read[device][index] for device, index in places)


def _finite(read: Dict[Any, List[float]], places: List[Place]) -> bool:
    return all(read[device][index] - read[device][index] == 0 for device, index in places)  # NaN, Inf: NaN


class StepLedger:
    """The values of the checks of the step under way (training thread, and autograd's)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.norms = getattr(torch, "_foreach_norm", None)
        self.checks: List[Check] = []
        self.grads: List[Tuple[Check, List[Place]]] = []  # in the order the backward pass met them
        self.parameter_grads: List[Tuple[Owner, Tuple[Any, ...], List[Place]]] = []
        self.values: Dict[Any, List[Any]] = {}  # device -> 0-d tensors, in the order made
        # id -> (weak reference, version counter, places) of each tensor reduced this step
        self.made: Dict[int, Tuple[Any, int, List[Place]]] = {}
        # id -> (weak reference, version counter, check, description) of each output checked
        self.producers: Dict[int, Tuple[Any, int, Check, Tuple[Any, ...]]] = {}
        self.count = 0
        self.reads = 0  # host reads made, one per device a step
        # (tensor, version, device, index) of the tensors waiting for one multi-tensor reduction
        self.batched: List[Tuple[Any, int, Any, int]] = []
        self.batched_bytes = 0
        self.batch_cpu = False  # CPU tensors batched too (tests: the CUDA path on a CPU)
        self.unread: Dict[Any, Any] = {}  # device -> a finite 0-d value for a tensor left unread

    def add(self, traced: Any, step: int, seq: int, outputs: List[Any], inputs: List[Any]) -> Optional[Check]:
        """A forward call: its outputs and inputs reduced, its inputs linked to the calls that made
        them. None past MAX_VALUES."""
        if self.count >= MAX_VALUES:
            return None
        torch, producers = self.torch, self.producers
        check = Check(traced, step, seq)
        for index, tensor in enumerate(inputs):
            tensor = plain(tensor, torch)
            if tensor is None:
                continue
            check.inputs.extend(self.reduce(tensor))
            made = producers.get(id(tensor))
            if made is not None and made[0]() is tensor:
                made[2].consumers.append((check, index, made[3]))
        for index, tensor in enumerate(outputs):
            tensor = plain(tensor, torch)
            if tensor is None:
                continue
            name = (f"output[{index}]", tensor.dtype, tuple(tensor.shape), tensor.device)
            check.described.append(name)
            check.outputs.append(self.reduce(tensor))
            made = producers.get(id(tensor))
            try:
                version = tensor._version
            except Exception:  # noqa: BLE001 - an inference tensor keeps no version counter
                version = -1
            # The first call to return a tensor made it (a container returns its child's), unless
            # it was written in place since (ReLU(inplace=True) returns its input, changed).
            if made is None or made[0]() is not tensor or made[1] != version:
                producers[id(tensor)] = (weakref.ref(tensor), version, check, name)
        self.checks.append(check)
        return check

    def add_gradient(self, check: Check, gradients: Any) -> None:
        """The gradient arriving at a checked call's output (autograd's node pre-hook)."""
        places: List[Place] = []
        for tensor in gradients:
            tensor = plain(tensor, self.torch)
            if tensor is not None:
                places.extend(self.reduce(tensor))
        self.grads.append((check, places))

    def add_parameter_gradients(self, parameters: List[Tuple[Owner, str, Any]]) -> None:
        """The parameters' gradients as the step ends (the optimizer's pre-hook: complete)."""
        for owner, name, ref in parameters:
            parameter = ref()
            grad = plain(parameter.grad, self.torch) if parameter is not None else None
            if grad is not None:
                label = (f"{name}.grad", grad.dtype, tuple(grad.shape), grad.device)
                self.parameter_grads.append((owner, label, self.reduce(grad)))

    def reduce(self, tensor: Any) -> List[Place]:
        """Values, on the tensor's device, that are finite exactly when all of it is."""
        known = self.made.get(id(tensor))
        try:
            version = tensor._version
        except Exception:  # noqa: BLE001 - an inference tensor keeps no version: reduced each time
            return self._reduce(tensor, None)
        if known is not None and known[0]() is tensor and known[1] == version:
            return known[2]
        places = self._reduce(tensor, version)
        self.made[id(tensor)] = (weakref.ref(tensor), version, places)
        return places

    def _reduce(self, tensor: Any, version: Optional[int]) -> List[Place]:
        device = tensor.device
        held = self.values.get(device)
        if held is None:
            held = self.values[device] = []
        if version is None or self.norms is None or (device.type == "cpu" and not self.batch_cpu):
            values = self.torch.aminmax(tensor.detach())
            places = [(device, len(held)), (device, len(held) + 1)]
            held.extend(values)
            self.count += 2
            return places
        place = (device, len(held))
        held.append(None)  # until flush()
        self.count += 1
        self.batched.append((tensor, version, device, place[1]))
        self.batched_bytes += tensor.numel() * tensor.element_size()
        if len(self.batched) >= BATCH or self.batched_bytes >= BATCH_BYTES:
            self.flush()
        return [place]

    def flush(self) -> None:
        """Reduce the waiting tensors, together; one written in place since is left unread."""
        batch, self.batched, self.batched_bytes = self.batched, [], 0
        live = []
        for tensor, version, device, index in batch:
            if tensor._version == version:
                live.append((tensor, device, index))
                continue
            unread = self.unread.get(device)
            if unread is None:
                unread = self.unread[device] = self.torch.zeros((), device=device)
            self.values[device][index] = unread
        if live and self.norms is not None:
            norms = self.norms([tensor.detach() for tensor, _, _ in live], INF)
            for (_, device, index), value in zip(live, norms):
                self.values[device][index] = value

    def settle(self) -> Optional[Finding]:
        """Read the step's values (one copy per device) and forget them: the step's first finding."""
        if self.batched:
            self.flush()
        checks, grads, parameter_grads, values = self.checks, self.grads, self.parameter_grads, self.values
        self.checks, self.grads, self.values, self.made, self.producers, self.count = [], [], {}, {}, {}, 0
        self.parameter_grads = []
        if not values:
            return None
        read: Dict[Any, List[float]] = {}
        total = 0.0
        for device, held in values.items():
            read[device] = self.torch.stack(held).tolist()  # promoted to the widest dtype
            total += sum(read[device])
            self.reads += 1
        if total - total == 0:  # every value finite (a NaN or an Inf would make it NaN)
            return None
        for check in checks:
            for position, places in enumerate(check.outputs):
                if not _finite(read, places):
                    return Finding(check, "forward", described(check.described[position]),
                                   _holds_nan(read, places), _finite(read, check.inputs))  # fmt: skip
        found = _backward_finding(grads, read)
        if found is not None or not checks:
            return found
        for owner, label, places in reversed(parameter_grads):
            if not _finite(read, places):
                last = checks[-1]
                return Finding(Check(owner, last.step, last.seq), "backward", described(label),
                               _holds_nan(read, places), True)  # fmt: skip
        return None


def _backward_finding(
    grads: List[Tuple[Check, List[Place]]], read: Dict[Any, List[float]]
) -> Optional[Finding]:
    """The first gradient read not finite, in the backward pass's order, blamed on the call that
    sent it there (the module docstring says how)."""
    previous: Optional[Check] = None
    for check, places in grads:
        if _finite(read, places):
            check.grad_finite = True
            previous = check
            continue
        nan = _holds_nan(read, places)
        for consumer, index, name in check.consumers:
            if consumer.grad_finite:
                return Finding(
                    consumer, "backward", described((f"grad_input[{index}]", *name[1:])), nan, True
                )
        output = check.described[0] if check.described else ("grad_input", "?", (), "?")
        if previous is not None:
            return Finding(previous, "backward", described(("grad_input", *output[1:])), nan, True)
        return Finding(check, "backward", described(("grad_output", *output[1:])), nan, False)
    return None
