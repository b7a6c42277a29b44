"""The NaN checks of one step, reduced on the device as the step runs and read once at its end.

Each check (a module's forward output, or the gradients its backward pass sends on) reduces its
floating tensors on their own device to values that are finite exactly when every element is:
on CUDA the largest magnitude of each tensor, for the whole group in one launch
(`torch._foreach_norm(..., inf)`, through which a NaN propagates); on the CPU, where that norm
is twenty times slower, each tensor's min and max (`aminmax`). A tensor met again in the step
(a container's output is its last child's; a module's input, the output before) is reduced
once: its values are found by identity, through a weak reference (so that a tensor freed and a
new one made at its address are never mistaken) and its version counter (an in-place write, as
`ReLU(inplace=True)` makes, moves it: then it is reduced again). Nothing is read in the hook, so
the step's kernels are never waited for there. `settle` reads the step's values in one copy per
device, before the optimizer's update (hooks.py), and names the step's first check whose
output was not finite, as the checks that read each value in the hook did.

Only where each value is reduced to one number is there no count: a finding says whether its
tensor holds a NaN (then neither count is known) or only Infs (no NaN, the Infs uncounted).
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Tuple

# Values held for one step (two per tensor on the CPU, one on CUDA); checks past them in that
# step are not made, and `nan status` says so.
MAX_VALUES = 200_000
INF = float("inf")


class Check:
    """One check made in the step: where its values are, and what its outputs were."""

    __slots__ = ("traced", "stage", "step", "seq", "described", "outputs", "inputs", "inputs_of")

    def __init__(
        self, traced: Any, stage: str, step: int, seq: int, described: List[Tuple[Any, ...]]
    ) -> None:
        self.traced = traced
        self.stage = stage
        self.step = step
        self.seq = seq
        self.described = described  # (name, dtype, shape, device) of each output checked
        # Where the values of each output and of the inputs are: (device, index) pairs.
        self.outputs: List[List[Tuple[Any, int]]] = []
        self.inputs: List[Tuple[Any, int]] = []
        self.inputs_of: Optional[Check] = None  # a backward check: its gradient's own check


class Finding:
    """The step's first non-finite output: which check, which tensor, and what it held."""

    __slots__ = ("check", "tensor", "nan", "inputs_finite")

    def __init__(self, check: Check, tensor: str, nan: bool, inputs_finite: bool) -> None:
        self.check = check
        self.tensor = tensor
        self.nan = nan  # it held a NaN; False: Infs and no NaN
        self.inputs_finite = inputs_finite


def plain(tensor: Any, torch: Any) -> Optional[Any]:
    """The tensor a check reduces, or None to leave it: a floating, non-empty plain tensor (a
    DTensor's local shard: its own reduction would be a collective one rank makes alone)."""
    local = getattr(tensor, "_local_tensor", None)
    if local is not None:
        tensor = local
    kind = type(tensor)
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        return None
    if not tensor.is_floating_point() or tensor.numel() == 0 or tensor.is_meta:
        return None
    return tensor


def finite(tensors: List[Any], torch: Any) -> List[bool]:
    """Whether each of some plain tensors is finite, read at once: one copy per device."""
    ledger = StepLedger(torch)
    places = [ledger.reduce(tensor) for tensor in tensors]
    read = {device: torch.stack(held).tolist() for device, held in ledger.values.items()}
    return [all(read[device][index] - read[device][index] == 0 for device, index in own) for own in places]


class StepLedger:
    """The values of the checks of the step under way (training thread only)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.norms = getattr(torch, "_foreach_norm", None)
        self.checks: List[Check] = []
        self.values: Dict[Any, List[Any]] = {}  # device -> 0-d tensors, in the order made
        # id -> (weak reference, version counter, places) of each tensor reduced this step
        self.made: Dict[int, Tuple[Any, int, List[Tuple[Any, int]]]] = {}
        self.count = 0
        self.full = False  # MAX_VALUES reached this step: later checks were not made
        self.reads = 0  # host reads made, one per device a step (for `nan status`)

    def add(self, traced: Any, stage: str, step: int, seq: int, outputs: List[Any], inputs: List[Any],
            names: str = "output") -> Optional[Check]:  # fmt: skip
        """Reduce a check's outputs and inputs on their devices; None when over MAX_VALUES."""
        torch = self.torch
        kept = []
        for index, tensor in enumerate(outputs):
            tensor = plain(tensor, torch)
            if tensor is not None:
                kept.append((index, tensor))
        described = [(f"{names}[{index}]", tensor.dtype, tuple(tensor.shape), tensor.device)
                     for index, tensor in kept]  # fmt: skip
        check = Check(traced, stage, step, seq, described)
        check.outputs = [self.reduce(tensor) for _, tensor in kept]
        for tensor in inputs:
            tensor = plain(tensor, torch)
            if tensor is not None:
                check.inputs.extend(self.reduce(tensor))
        if self.full:
            return None
        self.checks.append(check)
        return check

    def reduce(self, tensor: Any) -> List[Tuple[Any, int]]:
        """Values, on the tensor's device, that are finite exactly when all of it is."""
        known = self.made.get(id(tensor))
        try:
            version = tensor._version
        except Exception:  # noqa: BLE001 - an inference tensor keeps no version: reduced each time
            return self._reduce(tensor)
        if known is not None and known[0]() is tensor and known[1] == version:
            return known[2]
        places = self._reduce(tensor)
        self.made[id(tensor)] = (weakref.ref(tensor), version, places)
        return places

    def _reduce(self, tensor: Any) -> List[Tuple[Any, int]]:
        if self.count >= MAX_VALUES:
            self.full = True
            return []
        device = tensor.device
        if device.type == "cpu" or self.norms is None:
            values: Any = self.torch.aminmax(tensor.detach())
        else:
            values = self.norms([tensor.detach()], INF)
        held = self.values.get(device)
        if held is None:
            held = self.values[device] = []
        places = []
        for value in values:
            places.append((device, len(held)))
            held.append(value)
        self.count += len(places)
        return places

    def settle(self) -> Optional[Finding]:
        """Read the step's values (one copy per device) and forget them; the first check whose
        output held a NaN or Inf, in the order the checks were made."""
        checks, values = self.checks, self.values
        self.checks, self.values, self.made, self.count, self.full = [], {}, {}, 0, False
        if not checks:
            return None
        read: Dict[Any, List[float]] = {}
        for device, held in values.items():
            read[device] = self.torch.stack(held).tolist()  # promoted to the widest dtype
            self.reads += 1
        for check in checks:
            for position, places in enumerate(check.outputs):
                found = [read[device][index] for device, index in places]
                if all(value - value == 0 for value in found):  # finite: x - x is NaN for NaN and Inf
                    continue
                own = check.inputs_of.inputs if check.inputs_of is not None else check.inputs
                inputs_finite = all(read[device][index] - read[device][index] == 0 for device, index in own)
                name, dtype, shape, device = check.described[position]
                tensor = f"{name} {str(dtype).replace('torch.', '')}{list(shape)} on {device}"
                return Finding(check, tensor, any(value != value for value in found), inputs_finite)
        return None
