"""The zygote of one simulated node: imports what every rank has loaded (torch,
torch.distributed, the probing agent's modules) once, then forks the node's ranks from itself,
so that those pages are shared, as torchrun's launcher on a real node has its ranks as children.

    python benchmarks/scale/node.py --node N --ranks-per-node R --stuck-rank S

Run by scale_job.py as the init of the node's PID namespace (killing it ends the node). The job's
identity comes from the environment scale_job.py gives (WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT,
TORCHELASTIC_RUN_ID, PROBING_LISTEN, PROBING_TOKEN, and the per-rank placeholders). It reaps its
ranks, and ends them and itself when its stdin closes or after rank.LIFETIME_S.
"""

from __future__ import annotations

import argparse
import gc
import os
import select
import signal
import sys
import time
from typing import Dict, Optional, Tuple

import rank as rank_body

# What a request may load in a rank: imported here once, shared by every rank.
AGENT_MODULES = (
    "probing.agent", "probing.agent.server", "probing.agent.handlers", "probing.agent.tables",
    "probing.agent.stacks", "probing.agent.stack_sampler", "probing.agent.listener.control",
    "probing.agent.listener.acceptor", "probing.agent.listener.handshakes",
    "probing.agent.listener.registry", "probing.agent.listener.publisher",
    "probing.agent.memory.sampler", "probing.agent.records", "probing.protocol.sealed",
    "probing.protocol.auth",
)  # fmt: skip
REAP_INTERVAL_S = 0.5


def preload() -> None:
    import importlib

    import torch  # noqa: F401 - what a rank of a training job has loaded
    import torch.distributed  # noqa: F401 - the agent registers once the job has imported it

    for name in AGENT_MODULES:
        importlib.import_module(name)


def fork_ranks(
    node: int, ranks_per_node: int, stuck_rank: int, paced: Optional[Tuple[int, float, float]] = None
) -> Dict[int, int]:
    """{pid: rank} of the node's ranks, each forked from here and running rank.run_rank."""
    c10d = rank_body.load_stand_in()
    # Nothing the zygote allocated is ever scanned (and so written) by a rank's collector.
    gc.collect()
    gc.freeze()
    children: Dict[int, int] = {}
    for local_rank in range(ranks_per_node):
        rank = node * ranks_per_node + local_rank
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                rank_body.run_rank(rank, local_rank, stuck_rank, c10d, paced)
                code = 0
            except BaseException as error:  # noqa: BLE001 - said, then the child ends here
                rank_body.say(f"failed {rank} {type(error).__name__}: {error}")
            finally:
                os._exit(code)
        children[pid] = rank
    return children


def reap(children: Dict[int, int]) -> None:
    """Collect every rank that ended (and, as a namespace's init, any orphan)."""
    for _ in range(len(children) + 64):
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.pop(pid, None)


def serve(children: Dict[int, int]) -> None:
    """Until stdin closes (the harness is done) or the lifetime ends, reaping meanwhile."""
    deadline = time.monotonic() + rank_body.LIFETIME_S
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sys.stdin.fileno()], [], [], REAP_INTERVAL_S)
        if readable and not os.read(sys.stdin.fileno(), 4096):
            return
        reap(children)


def end(children: Dict[int, int]) -> None:
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while children and time.monotonic() < deadline:
        reap(children)
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--ranks-per-node", type=int, required=True)
    parser.add_argument("--stuck-rank", type=int, default=-1)
    parser.add_argument("--straggler", type=int, default=-1, help="a job slow, not stuck: this rank is late")
    parser.add_argument(
        "--start-at", type=float, default=0.0, help="the straggler scenario's step 0, epoch s"
    )
    parser.add_argument("--step-s", type=float, default=1.0)
    options = parser.parse_args()
    preload()
    paced = (options.straggler, options.start_at, options.step_s) if options.straggler >= 0 else None
    children = fork_ranks(options.node, options.ranks_per_node, options.stuck_rank, paced)
    rank_body.say(f"forked {len(children)}")
    try:
        serve(children)
    finally:
        end(children)


if __name__ == "__main__":
    main()
