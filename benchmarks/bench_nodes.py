"""--ranks across nodes, measured on real torchrun jobs (gloo, CPU) with two nodes simulated on this
machine (tests/support.py's TwoNodeJob: PID, mount and UTS namespaces, node N's agents listening
with a token on 127.0.0.(N+2)), each figure against a baseline taken in the same run (medians,
interleaved):

    .venv/bin/python benchmarks/bench_nodes.py [--ranks-per-node 2] [--runs 10]

`probing 1 query --ranks all` run in node 0 of a job of 2 nodes x R ranks (R answer over the Unix
socket, R over authenticated TCP, found through the job's rendezvous store), against

- the same query over the same number of ranks, all local: a one-node job of 2R ranks;
- the same query over node 0's own R ranks of the same job (`--ranks 0-(R-1)`).

Every CLI runs through `nsenter` into its job's namespaces, the one-node job's too (into the
namespaces it already shares), so that the cost of entering them is in every figure.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from support import PROBING, TorchrunJob, TwoNodeJob  # noqa: E402

QUERY = "SELECT node, rank, func, lineno FROM python.backtrace WHERE depth = 0"


def timed(commands: Dict[str, List[str]], environment: Dict[str, str], runs: int) -> Dict[str, float]:
    """Median wall time in ms of each command, the commands taking turns."""
    times: Dict[str, List[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            started = time.perf_counter()
            result = subprocess.run(command, capture_output=True, env=environment, timeout=120)
            times[name].append((time.perf_counter() - started) * 1000)
            if result.returncode != 0:
                raise RuntimeError(f"{name}: exit {result.returncode}: {result.stderr.decode()}")
    return {name: statistics.median(values) for name, values in times.items()}


def query_across_nodes(ranks_per_node: int, runs: int) -> None:
    total = 2 * ranks_per_node
    local = f"0-{ranks_per_node - 1}"
    with TwoNodeJob("idle", ranks_per_node=ranks_per_node, ready_timeout=300) as nodes, TorchrunJob(
        "idle", ranks=total, env={"PROBING": "1"}, ready_timeout=300
    ) as one_node:
        node0 = nodes.nodes[0]
        alone = ["nsenter", f"--target={one_node.agent_pid}", "--pid", "--mount", "--uts", "--"]

        def query(ranks: str) -> List[str]:
            return ["query", "--ranks", ranks, "--format", "json", QUERY]

        commands = {
            f"2 nodes x {ranks_per_node}, --ranks all": node0.command([PROBING, "1", *query("all")]),
            f"1 node x {total}, --ranks all": [*alone, PROBING, str(one_node.agent_pid), *query("all")],
            f"2 nodes x {ranks_per_node}, --ranks {local}": node0.command([PROBING, "1", *query(local)]),
        }
        timed(commands, nodes.cli_environment(), 1)  # warm: page cache, DuckDB's first import
        figures = timed(commands, nodes.cli_environment(), runs)
    names = list(figures)
    across, one_node_all, node0_only = (figures[name] for name in names)
    print(f"\n`query --ranks all` across 2 simulated nodes x {ranks_per_node} ranks, median of {runs}")
    for name in names:
        print(f"   {name:<32} {figures[name]:8.1f} ms")
    print(f"   ratio to the same number of local ranks (one node): {across / one_node_all:.2f}x")
    print(f"   ratio to node 0's own {ranks_per_node} ranks of the same job: {across / node0_only:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--runs", type=int, default=10)
    options = parser.parse_args()
    query_across_nodes(options.ranks_per_node, options.runs)


if __name__ == "__main__":
    main()
