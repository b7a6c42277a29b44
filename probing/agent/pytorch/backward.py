"""Timing a module's backward pass (`trace on --backward`), by autograd nodes.

Backward timing, like the NaN checks of gradients (nonfinite.py), uses autograd graph node hooks,
never module backward hooks:
`register_full_backward_hook` wraps the module's outputs in a custom autograd Function, and a
job that then modifies such an output in place (`out += identity` in every ResNet block) fails
with "a view ... is being modified inplace"; turning tracing on would crash the job. Node hooks
change neither the graph nor the tensors. When a traced module's forward returns, the nodes it
created are those reachable from its outputs' `grad_fn` whose sequence numbers lie between the
autograd counter's values before and after the call (each node takes the next number when it
is made); a prehook on the output nodes marks the start of the module's backward (its output
gradient is complete) and a post-hook on each node at the edge of that set (where gradients
leave the module for its inputs and parameters) marks the end, when the last of them has run.
The walk costs about a microsecond per node, and is made only on traced steps with `--backward`.
The hooks die with the graph at the end of the backward pass.

The walk runs in the training thread, inside a module's forward hook; the node hooks inside the
job's backward pass.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from ...originals import perf_counter
from .clock import StepClock, Traced

# A module whose autograd subgraph is larger than this is timed forward only (the walk would
# cost more than the module); its backward shows up in its parent's row.
MAX_WALK_NODES = 20_000


class _Backward:
    """The backward pass of one forward call of one module, timed by graph node hooks."""

    __slots__ = ("clock", "traced", "step", "started", "seq", "left", "events")

    def __init__(self, clock: StepClock, traced: Traced, step: int, edges: int) -> None:
        self.clock = clock
        self.traced = traced
        self.step = step
        self.started: Optional[float] = None
        self.seq = 0
        self.left = edges
        self.events: Optional[List[Any]] = None

    def begin(self, grad_outputs: Any) -> None:
        clock = self.clock
        try:
            if self.started is None:
                self.started = entered = perf_counter()
                self.seq = next(clock.seqs)
                if self.traced.cuda:
                    self.events = [clock.cuda_event()]
                clock.step_cost += perf_counter() - entered
        except Exception as error:  # noqa: BLE001 - never break the job's backward pass
            clock.failed(error)

    def edge_done(self, grad_inputs: Any, grad_outputs: Any) -> None:
        clock = self.clock
        try:
            if self.started is None:
                return
            entered = perf_counter()
            self.left -= 1
            if self.left <= 0:
                if self.events is not None:
                    self.events.append(clock.cuda_event())
                clock.record(self.traced, "backward", self.step, self.seq, self.started, entered, self.events)
            clock.step_cost += perf_counter() - entered
        except Exception as error:  # noqa: BLE001 - never break the job's backward pass
            clock.failed(error)


class BackwardWalk:
    """Finds the autograd nodes each traced forward call made, and hooks its edges."""

    def __init__(self, clock: StepClock, sequence_nr: Optional[Callable[[], int]]) -> None:
        self.clock = clock
        self.sequence_nr = sequence_nr  # None before torch 2.0: no walks
        self.walks: Dict[Any, List[Tuple[Any, List[Any]]]] = {}  # output node -> module's edges

    def forget(self) -> None:
        self.walks.clear()  # they hold graph nodes, and so the forward's saved tensors

    def watch(self, traced: Traced, step: int, counter: int, outputs: List[Any]) -> None:
        try:
            self._walk(traced, step, counter, outputs)
        finally:
            if traced.depth == 0:
                self.walks.clear()

    def _walk(self, traced: Traced, step: int, counter: int, outputs: List[Any]) -> None:
        after = self.sequence_nr() if self.sequence_nr is not None else 0
        heads = []
        for tensor in outputs:
            node = tensor.grad_fn
            if node is not None and counter <= node._sequence_nr() < after and node not in heads:
                heads.append(node)
        if not heads:
            return
        # A submodule's forward returned before this one's, and its walk left a summary under its
        # output node: (edge node, where gradients go from it). The walk jumps over the
        # submodule's nodes through it, so a forward pass walks each node about once, however
        # deep the modules nest.
        summaries = self.walks
        seen = set(heads)
        stack = list(heads)
        edges = []
        summary = []
        while stack:
            node = stack.pop()
            below = summaries.get(node)
            steps = (
                below if below is not None else [(node, [n for n, _ in node.next_functions if n is not None])]
            )
            for edge, targets in steps:
                exits = []
                for next_node in targets:
                    if counter <= next_node._sequence_nr() < after:
                        if next_node not in seen:
                            seen.add(next_node)
                            stack.append(next_node)
                    else:
                        exits.append(next_node)
                if exits or not targets:
                    edges.append(edge)
                    summary.append((edge, exits))
            if len(seen) > MAX_WALK_NODES:
                return
        for node in heads:
            summaries[node] = summary
        backward = _Backward(self.clock, traced, step, len(edges))
        for node in heads:
            node.register_prehook(lambda grad_outputs, b=backward: b.begin(grad_outputs))
        for node in edges:
            node.register_hook(
                lambda grad_inputs, grad_outputs, b=backward: b.edge_done(grad_inputs, grad_outputs)
            )
