"""What the torch tracer runs in a training step, counted in a process of its own, on the CPU.

    python torch_cost.py hooks    # probing hook entries per step, untraced and traced, two sizes
    python torch_cost.py reads    # host reads per step with NaN checks on, and the findings

Prints one JSON object. A hook entry is a call into probing's agent made by torch itself (a
frame in probing/agent whose caller is not): what a hook costs a step however much it then
calls. A host read is a call of any Tensor method that brings values to Python (`item`,
`tolist`, `__float__`, ...), counted while the step runs; the model's own code makes none.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List

import torch
from torch import nn

from probing.agent.pytorch import tracer as torchtrace

# The agent's own directory, as its code objects name their files; not any path with probing/agent/
# in it, which a checkout or a job may have too.
AGENT = os.path.join(os.path.dirname(os.path.dirname(torchtrace.__file__)), "")
READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy", "cpu")


class NanGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("nan")


class NanWeightGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad, grad.sum(0) * float("nan")


class Poison(nn.Module):
    """Passes its input on; at one step it makes a NaN: in its output, in the gradient it sends
    back (its input's gradient), or in its weight's gradient alone, which a backward check must
    blame on it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(8))
        self.at: Dict[str, int] = {}
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.at.get("forward") == self.calls - 1:
            return x * float("nan")
        if self.at.get("backward") == self.calls - 1:
            return NanGrad.apply(x)
        if self.at.get("weight") == self.calls - 1:
            return NanWeightGrad.apply(x, self.weight)
        return x + 0


class Still(torch.optim.Optimizer):
    """Steps (torch calls the global step hooks around it) and updates nothing: SGD would write a
    NaN gradient into the weights (lr 0 times NaN), and Adam and Adagrad read their step counts
    back (`.item()`), which would count here."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        return None


def model(blocks: int) -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU(), Poison()) for _ in range(blocks)])


def entries_per_step(net: nn.Module, steps: int, tracer: Any) -> List[Dict[str, Any]]:
    optimizer = torch.optim.SGD(net.parameters(), lr=0.0)
    data = torch.randn(4, 8)
    counted = {"n": 0}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(AGENT):
            caller = frame.f_back
            if caller is None or not caller.f_code.co_filename.startswith(AGENT):
                counted["n"] += 1

    found = []
    for _ in range(steps):
        counted["n"] = 0
        sys.setprofile(profile)
        try:
            optimizer.zero_grad()
            net(data).sum().backward()
            optimizer.step()
        finally:
            sys.setprofile(None)
        found.append({"step": tracer.clock.step, "traced": tracer.clock.tracing_now, "entries": counted["n"]})
    return found


def hooks() -> Dict[str, Any]:
    tracer = torchtrace.tracer()
    report: Dict[str, Any] = {}
    for blocks in (4, 16):
        net = model(blocks)
        tracer.configure_trace(4, False, None, None, None)
        report[str(blocks)] = {"modules": len(list(net.modules())), "steps": entries_per_step(net, 9, tracer)}
        tracer.trace_off()
        del net
    return report


def reads() -> Dict[str, Any]:
    counted = {"n": 0}
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counting(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            counted["n"] += 1
            return __original(self, *args, **kwargs)

        setattr(torch.Tensor, name, counting)
    tracer = torchtrace.tracer()
    report: Dict[str, Any] = {}
    for stage in ("forward", "backward", "weight"):
        net = model(6)
        poison = net[3][2]
        poison.at[stage] = 5  # block 3's sixth call
        optimizer = Still(net.parameters(), {})
        data = torch.randn(4, 8)
        tracer.configure_nan(True, False)
        per_step = []
        for _ in range(8):
            counted["n"] = 0
            optimizer.zero_grad()
            net(data).sum().backward()
            optimizer.step()
            per_step.append({"step": tracer.clock.step, "reads": counted["n"],
                             "start_check_done": tracer.nan.weights.finished.is_set()})  # fmt: skip
        first = tracer.status()["nan_session"]["first_event"]
        report[stage] = {"steps": per_step, "first_event": first}
        tracer.configure_nan(False, False)
        del net
    return report


if __name__ == "__main__":
    print(json.dumps({"hooks": hooks, "reads": reads}[sys.argv[1]]()))
