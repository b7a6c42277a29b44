"""The tracer's step clock, and the rows of python.torch_trace it stamps.

Steps come from global optimizer step hooks (hooks.py), so every optimizer is seen, whenever it
was made: the first module call after an optimizer step starts the next step, so micro-batches
of gradient accumulation share a step number and several optimizers stepping one after the
other close one step. A job with no optimizer counts calls of its top-level module instead.

Durations are perf_counter intervals on CPU. For modules on a CUDA device they come from CUDA
events recorded around the call and read once the device has passed them (`Event.query()`, at
step boundaries and when the table is fetched): nothing here ever synchronises the device on
the training thread. Events are made once and used again once read (`cuda_event`).

The clock also holds the switches every hook reads on each call (what is on, and whether this
step is traced), on one object, so that a hook pays one attribute lookup for each.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import threading
import weakref
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from ...originals import perf_counter, wall_time
from ...schema.tables import AGENT_TABLES
from ..ring import Ring

# Without --every, the tracer picks how many steps apart traced steps are, after each traced
# step: what tracing it cost (the time measured inside its hooks, the autograd graph walks and
# the CUDA events included, the reading of those events, and the attaching and detaching of the
# module hooks around it) stays under this share of the step time. A CPU transformer step of
# 300 ms with 60 modules costs ~0.1%: every step is traced; a 12 ms step of the same model on an
# H200 cost ~25% more traced (35-66 us a call), so about one step in 25 is.
DEFAULT_BUDGET = 0.01
MAX_AUTO_EVERY = 100
# Traced steps whose cost does not count towards `every`: those that end while `trace on` is
# searching the job's heap for models (it holds the GIL, which the hooks, timed on the wall
# clock, then wait for), and this many after it.
QUIET_STEPS = 2
QUIET_FOREVER = 1 << 62
DEFAULT_CAPACITY = 1_000_000
MB = 1024.0 * 1024.0
# CUDA events kept for use again once their durations are read.
EVENT_POOL = 4096
STAGES = ("forward", "backward", "optimizer")


def columns(table: str) -> List[Tuple[str, str]]:
    return [(column.name, column.type) for column in AGENT_TABLES[table].columns]


def trace_ring(capacity: int, name: str = "python.torch_trace") -> Ring:
    return Ring(name, columns("python.torch_trace"), capacity)


class Traced:
    """One hooked module: its handles, names, and the calls of it under way."""

    __slots__ = (
        "module",
        "name",
        "type_name",
        "name_code",
        "type_code",
        "depth",
        "cuda",
        "handles",
        "starts",
        "root",
        "pair",
    )

    def __init__(self, module: Any, name: str, depth: int, ring: Ring, cuda: bool) -> None:
        self.module = weakref.ref(module)
        self.name = name
        self.type_name = type(module).__name__
        self.name_code = ring.code(name)
        self.type_code = ring.code(self.type_name)
        self.depth = depth
        self.cuda = cuda
        self.handles: List[Any] = []
        self.root = depth == 0  # hooked whenever the tracer is: its calls mark steps (hooks.py)
        self.pair: Any = None  # its forward pre-hook and hook
        # (start, seq, autograd counter, CUDA start event) per call under way: a stack, as a
        # module may call itself.
        self.starts: List[Tuple[float, int, int, Any]] = []


class StepClock:
    """Step numbers, which steps are traced, and the rows of the traced ones."""

    def __init__(self, torch: Any, lock: threading.RLock) -> None:
        self.torch = torch
        self.lock = lock
        # Switches: set by the agent's thread (tracer.py), read by every hook.
        self.trace_on = False
        self.backward = False
        self.nan_on = False
        self.tracing_now = False  # trace_on, and this step is one of the traced ones
        self.watching = False  # tracing_now or nan_on: the module hooks have work this step
        self.error: Optional[str] = None
        # Which steps are traced.
        self.every = 1
        self.auto_every = True
        self.call_cost = 0.0  # seconds per traced call in the last traced step (for status)
        self.traced_cost = 0.0  # seconds the last traced step cost: its hooks, events, switches
        self.shares: Deque[float] = deque(maxlen=4)  # cost / the rest of the step, last traced steps
        self.quiet_steps = 0  # traced steps still to end before one's cost counts (QUIET_STEPS)
        self.step_calls = 0  # traced calls in the current step
        # Seconds spent in the hooks this step, measured in each (on traced steps).
        self.step_cost = 0.0
        # Seconds the last attaching and detaching of the module hooks took (hooks.py): a traced
        # step among untraced ones pays both.
        self.switch_cost = [0.0, 0.0]
        # Step numbering.
        self.step = 0
        self.seqs = itertools.count()
        self.step_pending = False
        self.optimizer_seen = False
        self.stepped: Set[int] = set()  # optimizers that stepped in the current step
        self.step_start = perf_counter()
        # Tracing sessions: each `trace on` while tracing was off begins the next (1, 2, ...). The
        # rows of the step under way when a session began carry its number negated: that step
        # began before tracing did, so its rows are part of a step, and its time is no step's.
        self.session = 0
        self.clock = (wall_time(), perf_counter())
        self.rank = 0
        self.rank_known = False
        # Rows.
        self.ring = trace_ring(DEFAULT_CAPACITY)
        self.stage_codes = {stage: self.ring.code(stage) for stage in STAGES}
        self.pending_cuda: List[Tuple[Tuple[Any, ...], Any, Any]] = []
        self.events: List[Any] = []  # CUDA events read and free to record again
        self.record_on = self.recording()
        self.streams: Dict[Tuple[int, int, int], Any] = {}  # current stream ids -> its Stream
        # The allocator's nested counters in one call (cuda_memory), looked up once.
        self.read_cuda_stats = getattr(getattr(torch, "_C", None), "_cuda_memoryStats", None)

    def new_ring(self, capacity: int) -> None:
        self.ring = trace_ring(capacity)
        self.stage_codes = {stage: self.ring.code(stage) for stage in STAGES}

    def refresh(self) -> None:
        sampled = self.step % self.every == 0
        self.tracing_now = self.trace_on and sampled
        self.watching = self.tracing_now or self.nan_on

    def begin_session(self) -> None:
        """Tracing goes on while it was off (agent thread, under the lock): the next session."""
        self.session = -(abs(self.session) + 1)

    def failed(self, error: BaseException) -> None:
        """A hook failed: stop everything rather than risk the job, and say why in status."""
        self.error = f"{type(error).__name__}: {error}"
        self.trace_on = self.nan_on = False
        self.tracing_now = self.watching = False

    def check_rank(self) -> None:
        distributed = sys.modules.get("torch.distributed")
        try:
            if distributed is not None and distributed.is_available() and distributed.is_initialized():
                self.rank = distributed.get_rank()
                self.rank_known = True
                return
        except Exception:  # noqa: BLE001
            pass
        self.rank = int(os.environ.get("RANK", "0") or 0)

    def advance(self) -> None:
        """The next step begins (in the training thread): choose whether it is traced."""
        started = perf_counter()
        if self.pending_cuda:
            self.resolve_cuda(wait=False)
        now = perf_counter()
        if self.tracing_now and self.step_calls:
            self.step_cost += now - started
            self.call_cost = self.step_cost / self.step_calls
            cost = self.traced_cost = self.step_cost + sum(self.switch_cost)
            if self.quiet_steps > 0:
                self.quiet_steps -= 1
            elif self.auto_every:
                # The least of the last few: a hook the machine's other work held up once (a
                # wall-clock measure) does not thin the trace out for the steps after.
                self.shares.append(cost / max(now - self.step_start - cost, 1e-9))
                self.every = max(1, min(MAX_AUTO_EVERY, math.ceil(min(self.shares) / DEFAULT_BUDGET)))
        self.step_calls = 0
        self.step_cost = 0.0
        self.step_pending = False
        self.stepped.clear()
        self.step += 1
        self.seqs = itertools.count()
        self.step_start = now
        if self.session < 0:
            self.session = -self.session  # a whole step of the session begins
        self.refresh()
        if not self.rank_known:
            self.check_rank()

    def record(
        self, traced: Traced, stage: str, step: int, seq: int, start: float, end: float, events: Any
    ) -> None:
        self.append(traced.name_code, traced.type_code, stage, step, seq, start, end, events, traced.cuda)

    def append(
        self, name_code: int, type_code: int, stage: str, step: int, seq: int, start: float, end: float,
        events: Any, optimizer_cuda: bool = False,
    ) -> None:  # fmt: skip
        self.step_calls += 1
        wall = self.clock[0] + (start - self.clock[1])
        row: Tuple[Any, ...]
        if optimizer_cuda:
            allocated, peak, reserved = self.cuda_memory()
            row = (step, seq, name_code, type_code, self.stage_codes[stage], end - start,
                   start - self.step_start, allocated, peak, reserved, self.rank, wall,
                   self.session)  # fmt: skip
        else:
            row = (step, seq, name_code, type_code, self.stage_codes[stage], end - start,
                   start - self.step_start, None, None, None, self.rank, wall, self.session)  # fmt: skip
        if events is None:
            self.ring.append(row)
        else:  # no lock: an append is atomic, and resolve_cuda deletes only what it read
            self.pending_cuda.append((row, events[0], events[-1]))

    def cuda_event(self) -> Any:
        """A timing event recorded now on the current stream: one read before, or a new one.
        `Event.record()` makes a Stream object for the current stream at each call; here the
        stream is looked up by the ids torch gives for it, and made once."""
        try:
            event = self.events.pop()
        except IndexError:
            event = self.torch.cuda.Event(enable_timing=True)
        record = self.record_on
        if record is None:
            event.record()
            return event
        ids = record[1](record[2]())
        stream = self.streams.get(ids)
        if stream is None:
            if len(self.streams) >= 64:  # a job that makes streams without end
                self.streams.clear()
            stream = self.streams[ids] = self.torch.cuda.Stream(stream_id=ids[0], device_index=ids[1],
                                                                device_type=ids[2])  # fmt: skip
        record[0](event, stream)
        return event

    def recording(self) -> Optional[Tuple[Any, Any, Any]]:
        """Torch's bindings to record an event, to read the current stream's ids and the current
        device; None where one is missing (a CPU build: Event.record, which says why)."""
        bindings = self.torch._C
        base = getattr(bindings, "_CudaEventBase", None)
        found = (getattr(base, "record", None), getattr(bindings, "_cuda_getCurrentStream", None),
                 getattr(bindings, "_cuda_getDevice", None))  # fmt: skip
        return found if all(found) else None

    def cuda_memory(self) -> Tuple[float, float, float]:
        """MB allocated, its peak, and reserved on the current CUDA device, now. One read of the
        allocator's nested counters: torch.cuda.memory_allocated() and its kin each flatten
        the whole stats dict, ~100 us apiece on an H100 host, which made a traced CUDA module
        call cost 0.6 ms."""
        cuda = self.torch.cuda
        read = self.read_cuda_stats
        if read is None:  # a torch without it: the public calls
            return (cuda.memory_allocated() / MB, cuda.max_memory_allocated() / MB,
                    cuda.memory_reserved() / MB)  # fmt: skip
        stats = read(cuda.current_device())
        allocated = stats["allocated_bytes"]["all"]
        return (
            allocated["current"] / MB,
            allocated["peak"] / MB,
            stats["reserved_bytes"]["all"]["current"] / MB,
        )

    def resolve_cuda(self, wait: bool = True) -> None:
        """Fill in the durations of CUDA calls the device has finished, oldest first; from the
        training thread (`wait` False) only where the lock is free at once."""
        if not self.lock.acquire(blocking=wait):
            return
        try:
            done = 0
            for row, start, end in self.pending_cuda:
                if not end.query():
                    break
                finished = list(row)
                finished[5] = start.elapsed_time(end) / 1000.0
                self.ring.append(finished)
                done += 1
                if len(self.events) < EVENT_POOL:
                    self.events += (start, end)
            del self.pending_cuda[:done]
        finally:
            self.lock.release()
