"""One rank of the scale harness: what runs in a child forked from its node's zygote (node.py).

A rank is a real Python process with the real probing agent, known to the CLI exactly as a
torchrun rank is: RANK and LOCAL_RANK in its start-up environment (what the CLI reads in
/proc/PID/environ), its agent listening on its node's loopback address with the token and
registered in the job's rendezvous store (torch's TCPStore). It does not train: it holds the
stacks of a hung job, its main thread blocked in an all_reduce (stacks/torch/distributed) or,
on the stuck rank, sleeping in load_shard, beside two threads of its own.

Or, for `stragglers` (a straggler rank given), a job that is slow, not stuck: every rank calls a
real torch all_reduce once a step on one schedule (start_at + step * step_s), each in a gloo world
of its own (2:cores cannot run a gloo group of 1 024), so that its real Flight Recorder holds its
arrival at each step's collective, the same sequence numbers on every rank; the straggler reads
its shard for STRAGGLER_SHARE of a step first. The timings are the schedule's, derived, not a
collective's: labelled so in docs/scale.md.

A forked child shares the zygote's start-up environment block, so the zygote starts with blank
placeholders for the variables that differ per rank, and each child writes its own values into
its copy of the block (set_start_environment).
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import os
import queue
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Dict, Optional, Tuple

# The variables that differ per rank: the zygote starts with each one set to this many blanks.
PER_RANK_VARIABLES = ("RANK", "LOCAL_RANK")
PLACEHOLDER_WIDTH = 8
STAND_IN = Path(__file__).resolve().parent / "stacks" / "torch" / "distributed" / "distributed_c10d.py"
# A rank never outlives this, even if nobody kills it (the harness always does, much sooner).
LIFETIME_S = 3600.0
# The straggler's shard read, as a share of the step.
STRAGGLER_SHARE = 0.2


def placeholders() -> Dict[str, str]:
    """What the zygote's environment holds for the per-rank variables: blanks, no number (the
    zygote itself is no rank to the CLI)."""
    return {name: " " * PLACEHOLDER_WIDTH for name in PER_RANK_VARIABLES}


def _environ_span() -> Tuple[int, int]:
    """Where this process's start-up environment lies in its memory (env_start, env_end: fields
    50 and 51 of /proc/self/stat, counted from 1)."""
    with open("/proc/self/stat", "rb") as handle:
        stat = handle.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[47]), int(fields[48])


def set_start_environment(values: Dict[str, str]) -> None:
    """Write `values` over their placeholders in the start-up environment block, which is what
    /proc/PID/environ shows (os.environ's setenv copies strings elsewhere), and into os.environ."""
    start, end = _environ_span()
    block = ctypes.string_at(start, end - start)
    for name, value in values.items():
        key = f"{name}=".encode()
        at = 0 if block.startswith(key) else block.index(b"\0" + key) + 1
        text = value.encode().ljust(PLACEHOLDER_WIDTH)
        width = block.index(b"\0", at) - at - len(key)
        if len(text) != width:
            raise ValueError(f"{name}={value!r} does not fit the placeholder of {width} characters")
        ctypes.memmove(start + at + len(key), text, len(text))
        os.environ[name] = value


def load_stand_in() -> ModuleType:
    """The all_reduce stand-in, by its path (it must never shadow the real torch.distributed)."""
    spec = importlib.util.spec_from_file_location("scale_distributed_c10d", STAND_IN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def say(line: str) -> None:
    # One write(2): every rank of a node shares the zygote's stdout pipe.
    os.write(1, f"{line}\n".encode())


def prefetch_batches(batches: queue.Queue[object]) -> None:
    """A data-prefetch thread, waiting for work that never comes."""
    batches.get(timeout=LIFETIME_S)


def watch_checkpoints(stop: threading.Event) -> None:
    """A checkpoint watchdog, waiting to be told to stop."""
    stop.wait(LIFETIME_S)


def start_own_threads() -> None:
    batches: queue.Queue[object] = queue.Queue()
    stop = threading.Event()
    threading.Thread(target=prefetch_batches, args=(batches,), name="prefetch", daemon=True).start()
    threading.Thread(target=watch_checkpoints, args=(stop,), name="checkpoint-watchdog", daemon=True).start()


def load_shard(step: int) -> None:
    """The data shard that never arrives (the stuck rank)."""
    time.sleep(LIFETIME_S)


def sync_gradients(c10d: ModuleType, bucket: object) -> None:
    c10d.all_reduce(bucket)


def train_step(c10d: ModuleType, step: int, stuck: bool) -> None:
    if stuck:
        load_shard(step)
        return
    sync_gradients(c10d, [0.0] * 16)


def wait_for_step(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


def read_shard(seconds: float) -> None:
    """The straggler's slow disk."""
    time.sleep(seconds)


def paced_steps(rank: int, straggler: int, start_at: float, step_s: float) -> None:
    """The straggler scenario's loop: from step 0, so that a rank forked late catches up at once."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    bucket = torch.zeros(16)
    say(f"ready {rank} {os.getpid()}")
    for step in itertools.count():
        wait_for_step(start_at + step * step_s)
        if rank == straggler:
            read_shard(STRAGGLER_SHARE * step_s)
        dist.all_reduce(bucket)


def run_rank(
    rank: int,
    local_rank: int,
    stuck_rank: int,
    c10d: ModuleType,
    paced: Optional[Tuple[int, float, float]] = None,
) -> None:
    """The body of a forked rank: become the rank, start the agent, then hang as the job does (or,
    with `paced` = (straggler, start_at, step_s), step on a schedule with one rank late)."""
    set_start_environment({"RANK": str(rank), "LOCAL_RANK": str(local_rank)})
    import probing.agent

    if not probing.agent.start():
        raise RuntimeError(f"rank {rank}: the agent did not start: {probing.agent.last_error}")
    start_own_threads()
    if paced is not None:
        paced_steps(rank, *paced)
        return
    say(f"ready {rank} {os.getpid()}")
    train_step(c10d, 5, stuck=rank == stuck_rank)
