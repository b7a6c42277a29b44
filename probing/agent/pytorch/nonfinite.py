"""NaN/Inf checks (`probing PID nan on [--stop]`): which module first made a non-finite value.

The forward output of every hooked module is checked when it returns, and the gradients a
module's backward pass sends to its inputs when they leave it (backward.py); the first finding
of a step is recorded in python.nan_events, with whether the module's own inputs were finite
(so that the row names the module that made the NaN, not one that passed it on).

The checks read each checked value (`.item()`), in the training thread (they run inside its
hooks, never in the agent's threads), which on CUDA waits for the device: they are a
diagnostic mode, off by default. The one exception a hook raises on purpose is
`NonFiniteError`, under `--stop`.
"""

from __future__ import annotations

import math
import sys
from typing import Any, List, Optional, Sequence, Tuple

from ...originals import wall_time
from ..ring import Ring
from .clock import StepClock, Traced, columns

NAN_CAPACITY = 10_000


class NonFiniteError(FloatingPointError):
    """Raised in the training thread by `probing PID nan on --stop` at the first NaN/Inf."""


# The name the job's traceback prints and the name users catch it by (tracer.py exports it),
# as numpy names its public classes after the module they are exported from.
NonFiniteError.__module__ = __package__ + ".tracer"


def flat_tensors(value: Any, torch: Any, limit: int = 64) -> List[Any]:
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


class NanChecks:
    """What `nan on` found: python.nan_events, at most one row a step. Switched on and off
    through `clock.nan_on`, which the hooks read."""

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock
        self.torch = clock.torch
        self.stop = False  # --stop: raise NonFiniteError at the next finding, once
        self.ring = Ring("python.nan_events", columns("python.nan_events"), NAN_CAPACITY)
        self.stage_codes = {stage: self.ring.code(stage) for stage in ("forward", "backward")}
        self.step = -1  # the last step with a finding: later values that step are its echoes
        self.events = 0
        self.stopped_at: Optional[int] = None

    def check_forward(self, traced: Traced, step: int, seq: int, args: Any, outputs: List[Any]) -> None:
        found = nonfinite(outputs, self.torch)
        if found is None:
            return
        inputs_finite = nonfinite(flat_tensors(args, self.torch), self.torch) is None
        where = f"output[{found[0]}] " + describe_tensor(outputs[found[0]])
        self.event(traced, "forward", step, seq, where,
                   found[1], found[2], inputs_finite)  # fmt: skip

    def event(
        self, traced: Traced, stage: str, step: int, seq: int, tensor: str, nans: int, infs: int,
        inputs_finite: bool,
    ) -> None:  # fmt: skip
        ring = self.ring
        with self.clock.lock:
            if self.step == step:
                return
            self.step = step
            self.events += 1
            ring.append((step, seq, ring.code(traced.name), ring.code(traced.type_name),
                         self.stage_codes[stage], ring.code(tensor), nans, infs, inputs_finite,
                         self.clock.rank, wall_time()))  # fmt: skip
            stop = self.stop
            self.stop = False
            if stop:
                self.stopped_at = step
        if stop:
            error = NonFiniteError(
                f"probing: {nans} NaN and {infs} Inf in the {stage} {tensor.split(' ')[0]} of {traced.name} "
                f"({traced.type_name}) at step {step}; stopped by `probing nan on --stop`"
            )
            # A record of the moment, written here in the training thread (records/), even when
            # the job catches the error to checkpoint and exit.
            records = sys.modules.get(__package__.rsplit(".", 1)[0] + ".records")
            if records is not None:
                records.before_nonfinite_raise(error)
            raise error
