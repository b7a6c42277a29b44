"""NaN/Inf checks (`probing PID nan on [--stop]`, PROBING_NAN=1): which module first made a
non-finite value, and whether its weights already were.

The forward output of every hooked module is checked when it returns, and the gradient that
arrives at its output in the backward pass (ledger.py says how a backward NaN is blamed on the
module that made it); the first finding
of a step is recorded in python.nan_events, with whether the module's own inputs were finite
and whether its own weights were (weights.py): a module with finite inputs whose parameters
are NaN did not make the NaN there, an earlier update did. Every parameter and buffer is also
checked when a session of checks begins, so that weights that were NaN before the checks are
told apart from weights that went NaN since.

The checks run in the training thread (inside its hooks, never in the agent's threads). They
reduce each tensor on its device and read nothing there (ledger.py): the step's values are read
once, when the step ends, before the optimizer's update (`settle`, from the optimizer's
pre-hook, or at the next step's first call in a job without one), so the weights the finding's
module is checked for are the ones it computed with, and `--stop` stops the job before an
update from a NaN gradient. The one exception a hook raises on purpose is `NonFiniteError`,
under `--stop`.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ...originals import wall_time
from ..ring import Ring
from .clock import StepClock, Traced, columns
from .finite import flat_tensors
from .ledger import Check, Finding, Owner, StepLedger, parameters_of
from .safepoint import DEFAULT_STEP_WAIT_S
from .weights import EventWeights, WeightsAtStart, module_weights

NAN_CAPACITY = 10_000
# How long `nan on` waits for the start check of the weights, to say what it found.
WEIGHTS_WAIT_S = DEFAULT_STEP_WAIT_S
# Records this process wrote, named by `nan status` as where earlier state may be.
RECORDS_NAMED = 3


class NonFiniteError(FloatingPointError):
    """Raised in the training thread by `probing PID nan on --stop` at the first NaN/Inf."""


# The name the job's traceback prints and the name users catch it by (tracer.py exports it),
# as numpy names its public classes after the module they are exported from.
NonFiniteError.__module__ = __package__ + ".tracer"


def weights_words(module: str, weights: EventWeights, already: Optional[bool]) -> str:
    """The clause --stop's message adds when the module's weights were not finite."""
    if weights.finite is not False:
        return ""
    if already:
        return f"; the weights of {module} were already NaN/Inf when checks began (the cause is earlier)"
    return f"; the weights of {module} were NaN/Inf ({', '.join(weights.names)})"


class NanChecks:
    """What `nan on` found: python.nan_events, at most one row a step, and the weights of the
    job's models. Switched on and off through `clock.nan_on`, which the hooks read."""

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock
        self.torch = clock.torch
        self.stop = False  # --stop: raise NonFiniteError at the next finding, once
        self.ring = Ring("python.nan_events", columns("python.nan_events"), NAN_CAPACITY)
        self.stage_codes = {stage: self.ring.code(stage) for stage in ("forward", "backward")}
        self.step = -1  # the last step with a finding: later values that step are its echoes
        self.ledger = StepLedger(self.torch)  # the step's checks, read when it ends
        self.sequence_nr: Optional[Callable[[], int]] = None  # autograd's counter (tracer.py)
        # The trainable parameters of the models covered this session, whose gradients are
        # checked as each step ends (ledger.py), and their ids.
        self.parameters: List[Tuple[Owner, str, Any]] = []
        self.parameter_ids: Set[int] = set()
        self.events = 0
        self.stopped_at: Optional[int] = None
        # Whether a module is hooked (its output is checked as its own): set by the tracer.
        self.hooked: Callable[[Any], bool] = lambda module: False
        # The session of checks under way: its start check of the weights, its first event, and
        # how many events earlier sessions left in python.nan_events (the first of them kept).
        self.weights = WeightsAtStart(self.torch, 0)
        self.weights_due = False  # the start check has work: read by every forward pre-hook
        self.sessions = 0
        self.events_before = 0
        self.first_event: Optional[Dict[str, Any]] = None
        self.earliest: Optional[Dict[str, Any]] = None

    # --- sessions (agent's thread, or the job's at PROBING_NAN, under the tracer's lock) ---------

    def begin(self) -> None:
        """Checks go on while they were off: a new session, whose weights are checked afresh."""
        self.step = -1
        self.ledger = StepLedger(self.torch)  # a new object: the training thread may hold the old
        self.weights = WeightsAtStart(self.torch, self.clock.step)
        self.weights_due = False
        self.parameters, self.parameter_ids = [], set()
        self.sessions += 1
        self.events_before = self.events
        self.first_event = None

    def end(self) -> None:
        """Checks go off: the start check stops (what it found stays for status), and the step's
        values and the tensors waiting for them are let go (a new ledger: the training thread may
        still hold the old one, which goes with it)."""
        self.weights_due = False
        self.weights.pending, self.weights.modules = [], []
        self.ledger = StepLedger(self.torch)

    def cover(self, name: str, root: Any) -> None:
        """A model found while checks are on (hooks.add_root): its weights join the start check."""
        if not self.clock.nan_on:
            return
        self.weights.cover(name, root)
        self.weights_due = True
        self.parameters = self.parameters + parameters_of(name, root, self.parameter_ids)

    # --- training thread -------------------------------------------------------------------------

    def work_on_weights(self) -> None:
        """A piece of the start check (a forward pre-hook: a module boundary)."""
        if not self.clock.nan_on:  # a hook failed and turned the checks off (clock.failed)
            self.weights_due = False
            return
        self.weights.work(self.clock.step)
        if not self.weights.due:
            self.weights_due = False
            if self.weights.due:  # a model queued meanwhile (cover: queue it, then set the flag)
                self.weights_due = True

    def check_forward(
        self, traced: Traced, step: int, seq: int, args: Any, outputs: List[Any], counter: int
    ) -> None:
        """A module's forward call returned: its output and inputs are checked, and the gradient
        that will arrive at its output, by a pre-hook on each autograd node the call made for
        an output (one whose sequence number the call's counter values bracket)."""
        ledger = self.ledger
        check = ledger.add(traced, step, seq, outputs, flat_tensors(args, self.torch))
        if check is None:
            return
        after = self.sequence_nr() if self.sequence_nr is not None else None
        heads: List[Any] = []
        for tensor in outputs:
            node = tensor.grad_fn
            if (
                node is not None
                and node not in heads
                and (after is None or counter <= node._sequence_nr() < after)
            ):
                heads.append(node)
        for node in heads:
            node.register_prehook(lambda gradients, check=check: self.gradient(ledger, check, gradients))

    def gradient(self, ledger: StepLedger, check: Check, gradients: Any) -> None:
        """In the backward pass (autograd's thread): never raises into it."""
        try:
            if self.clock.nan_on and ledger is self.ledger:
                ledger.add_gradient(check, gradients)
        except Exception as error:  # noqa: BLE001
            self.clock.failed(error)

    def settle(self) -> None:
        """The step's checks are read (the step ends, before any update): its first finding is
        recorded, and raised under --stop."""
        ledger = self.ledger
        if self.parameters and ledger.checks:
            ledger.add_parameter_gradients(self.parameters)
        found = ledger.settle()
        if found is not None and self.clock.nan_on and ledger is self.ledger:
            self.event(found)

    def event(self, found: Finding) -> None:
        check = found.check
        traced, stage, step, seq, tensor = check.traced, found.stage, check.step, check.seq, found.tensor
        inputs_finite = found.inputs_finite
        # A NaN leaves both counts unknown; Infs alone, no NaN and the Infs uncounted (ledger.py).
        nans, infs = (None, None) if found.nan else (0, None)
        ring = self.ring
        with self.clock.lock:
            if self.step == step:
                return
            self.step = step
            self.weights.event_seen = True
        # Its weights matter only where it made the NaN from finite inputs: then they tell an
        # update that wrote NaN into them (earlier) from a computation that made it (here).
        module = traced.module()
        weights = EventWeights(None, [], 0)
        if module is not None and inputs_finite:
            weights = module_weights(module, traced.name, self.torch, self.hooked, self.weights.unwritten)
        already = self.weights.already(weights)
        with self.clock.lock:
            self.events += 1
            ring.append((step, seq, ring.code(traced.name), ring.code(traced.type_name),
                         self.stage_codes[stage], ring.code(tensor), nans, infs, inputs_finite,
                         weights.finite, already, self.clock.rank, wall_time()))  # fmt: skip
            if self.first_event is None:
                self.first_event = {
                    "step": step, "module": traced.name, "module_type": traced.type_name, "stage": stage,
                    "tensor": tensor, "nan_count": nans, "inf_count": infs, "input_finite": inputs_finite,
                    "weights_finite": weights.finite, "weights_already_nonfinite": already,
                    "nonfinite_weights": weights.names, "nonfinite_weight_count": weights.count,
                }  # fmt: skip
                if self.earliest is None:
                    self.earliest = {"step": step, "module": traced.name, "stage": stage}
            stop = self.stop
            self.stop = False
            if stop:
                self.stopped_at = step
        if stop:
            error = NonFiniteError(
                f"probing: {'NaN' if found.nan else 'Inf'} in the {stage} {tensor.split(' ')[0]} "
                f"of {traced.name} "
                f"({traced.type_name}) at step {step}{weights_words(traced.name, weights, already)}; "
                "stopped by `probing nan on --stop`"
            )
            # A record of the moment, written here in the training thread (records/), even when
            # the job catches the error to checkpoint and exit.
            records = sys.modules.get(__package__.rsplit(".", 1)[0] + ".records")
            if records is not None:
                records.before_nonfinite_raise(error)
            raise error

    # --- status (agent's thread) -----------------------------------------------------------------

    def status(self) -> Optional[Dict[str, Any]]:
        """What this session found, and what history the process keeps of earlier ones (None
        before the first session)."""
        if not self.sessions:
            return None
        earlier = None
        if self.events_before and self.earliest is not None:
            earlier = dict(self.earliest, count=self.events_before)
        return {
            "since_step": self.weights.began_step,
            "weights": self.weights.summary(),
            "first_event": self.first_event,
            "earlier_events": earlier,
            "records_written": written_records()[-RECORDS_NAMED:],
            "weights_wait_s": WEIGHTS_WAIT_S,
        }


def written_records() -> List[str]:
    """Paths of the records this process wrote (records/), oldest first."""
    records = sys.modules.get(__package__.rsplit(".", 1)[0] + ".records")
    current = getattr(records, "current", None)
    active = current() if current is not None else None
    return [str(path) for path in getattr(active, "written", ())]
