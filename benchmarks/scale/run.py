"""Today's CLI against a whole job of real agents at scale (issue 28's baseline): for each size,
start the job (scale_job.py), time `ranks`, `backtrace --ranks all`, `query --ranks all`, `hang
--ranks all --duration 10`, each run in node 0 as a user on that node would, with its peak RSS
and descriptors; then the same job with 5% of its ranks killed and one node frozen.

    .venv/bin/python benchmarks/scale/run.py --ranks 16,64,256 --nodes 4
    .venv/bin/python benchmarks/scale/run.py --ranks 1024 --nodes 16 --profile /tmp/scale-profile

One run of each command per size (a 1 024-rank job takes minutes to start on 2 cores); the
machine's load average is printed with every size, since the box is shared.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import Measured, measure, memory_of_ranks  # noqa: E402
from scale_job import PROBING, ScaleJob  # noqa: E402

COMMANDS: Dict[str, List[str]] = {
    "ranks": ["ranks"],
    "backtrace": ["backtrace", "--ranks", "all"],
    "query": ["query", "--ranks", "all", "SELECT count(*) FROM python.backtrace"],
    "hang": ["hang", "--ranks", "all", "--duration", "10"],
}


def ranks_text(ranks: List[int]) -> str:
    """0-6,8 as the CLI heads a fold (runs of three or more as ranges); written here again, so
    that a check does not take the CLI's own word for it."""
    ordered, parts, index = sorted(set(ranks)), [], 0
    while index < len(ordered):
        end = index
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        run = ordered[index : end + 1]
        parts += [f"{run[0]}-{run[-1]}"] if len(run) >= 3 else [str(rank) for rank in run]
        index = end + 1
    return ",".join(parts)


def main_thread_folds(stdout: str) -> Dict[str, str]:
    """heading's ranks -> state, for each fold of a main thread in `backtrace --ranks all`."""
    folds, heading = {}, None
    for line in stdout.splitlines():
        found = re.match(r"── ranks? (\S+) \(", line)
        if found:
            heading = found.group(1)
        elif heading and line.startswith('Thread "MainThread"'):
            folds[heading] = line.split(": ", 1)[1].split(" (most recent")[0]
    return folds


def verdict(name: str, job: ScaleJob, alive: List[int], result: Measured) -> str:
    """A few words on whether the answer is right for this job (`alive`: the ranks that live)."""
    if name == "ranks":
        rows = [line for line in result.stdout.splitlines() if re.match(r"\s*\d+\s+\d+\s+\d+\s", line)]
        return f"{len(rows)} rows"
    if name == "backtrace":
        folds = main_thread_folds(result.stdout)
        waiting = ranks_text([rank for rank in alive if rank != job.stuck_rank])
        right = folds.get(waiting) == "in torch.distributed.all_reduce" and job.stuck_rank in alive
        return f"{len(folds)} main folds, {'exact' if right else 'NOT exact'}"
    if name == "query":
        numbers = re.findall(r"^\s*(\d+)\s*$", result.stdout, re.M)
        return f"count {numbers[0] if numbers else '?'}"
    first = result.stdout.splitlines()[0] if result.stdout else ""
    named = f"rank {job.stuck_rank} " in first
    return f"culprit {'named' if named else 'NOT named'}"


def run_commands(
    job: ScaleJob, alive: List[int], label: str, rows: List[Tuple[str, ...]], options: Any
) -> None:
    """Each command in each form: `probing 1 ...` (the job found from node 0's zygote, the other
    nodes' ranks through the store, each node's through its relay), the same with every rank asked
    directly (`direct`: PROBING_RELAY=0, the baseline of relays in the same run), and
    `probing --endpoints @FILE ...` (no store)."""
    targets = {"store": ["1"], "direct": ["1"], "endpoints": ["--endpoints", f"@{job.endpoints_file()}"]}
    commands = [(name, COMMANDS[name]) for name in options.commands.split(",")]
    for (name, args), form in itertools.product(commands, options.forms.split(",")):
        argv = job.cli_command(0, *targets[form], *args)
        environment = job.cli_environment()
        if form == "direct":
            environment["PROBING_RELAY"] = "0"
        result = measure(argv, environment, options.timeout)
        if options.outputs:
            stem = os.path.join(options.outputs, re.sub(r"\W+", "_", f"{label}-{form}-{name}"))
            Path(f"{stem}.out").write_text(result.stdout)
            Path(f"{stem}.err").write_text(result.stderr)
        missing_lines = sum(1 for line in result.stderr.splitlines() if line.startswith("probing: rank"))
        figures = (f"{result.seconds:.2f}", f"{result.peak_rss_mb:.0f}", str(result.peak_fds))
        rows.append((label, form, name, *figures, str(result.returncode), str(missing_lines),
                     f"{len(result.stdout) // 1024}", verdict(name, job, alive, result)))  # fmt: skip
        print("   ".join(rows[-1]), flush=True)


def degrade(job: ScaleJob) -> List[int]:
    """Kill 5% of the ranks (spread over the nodes, never the stuck one) and freeze the last node
    (SIGSTOP: its sockets accept, nothing answers). The ranks that still answer."""
    count = max(1, job.world_size // 20)
    step = job.world_size // count
    killed = [(index * step + 1) % job.world_size for index in range(count)]
    killed = [rank if rank != job.stuck_rank else rank - 1 for rank in killed]
    job.kill_ranks(killed)
    frozen = job.nodes[-1] if len(job.nodes) > 1 else None
    if frozen is not None:
        frozen.signal_all(signal.SIGSTOP)
    gone = set(killed) | set(frozen.pids if frozen else ())
    print(f"   killed ranks {ranks_text(killed)}, froze {frozen.name if frozen else 'no node'}", flush=True)
    return [rank for rank in range(job.world_size) if rank not in gone]


def one_size(ranks: int, nodes: int, rows: List[Tuple[str, ...]], options: Any) -> None:
    print(f"\n== {ranks} ranks on {nodes} nodes; load average {os.getloadavg()[0]:.2f} ==", flush=True)
    with ScaleJob(ranks, nodes, ready_timeout=1800) as job:
        zygotes = [node.init_pid or 0 for node in job.nodes]
        pids = [pid for node in job.nodes for pid in node.rank_pids_outside().values()]
        memory = memory_of_ranks(pids, zygotes)
        print(f"   started in {job.start_seconds:.1f} s; per rank PSS {memory.pss_mb_per_rank:.1f} MB "
              f"(RSS {memory.rss_mb_per_rank:.1f}, private {memory.private_mb_per_rank:.1f}); zygote PSS "
              f"{memory.zygote_pss_mb:.0f} MB; all ranks + zygotes {memory.total_pss_mb / 1024:.2f} GB; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
        label = f"{ranks}/{nodes}"
        run_commands(job, list(range(ranks)), label, rows, options)
        for name in options.profile.split(",") if options.profile else []:
            from cli_profile import profile, report

            target = ["--endpoints", f"@{job.endpoints_file()}"]
            report(f"{name} --endpoints at {label}", profile(job, [*target, *COMMANDS[name]]))
        if not options.no_degraded:
            alive = degrade(job)
            run_commands(job, alive, f"{label} -5%,-1 node", rows, options)


def print_table(rows: List[Tuple[str, ...]]) -> None:
    header = ("ranks/nodes", "form", "command", "seconds", "CLI RSS MB", "CLI fds", "exit", "missing lines",
              "stdout KB", "answer")  # fmt: skip
    widths = [max(len(row[index]) for row in [header, *rows]) for index in range(len(header))]
    print()
    for row in [header, tuple("-" * width for width in widths), *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="16,64,256", help="sizes, comma-separated")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--no-degraded", action="store_true", help="skip the 5%%-dead, one-node-frozen case")
    parser.add_argument(
        "--forms",
        default="store,direct,endpoints",
        help="store: `probing 1` (relays); direct: the same, PROBING_RELAY=0; endpoints: --endpoints @FILE",
    )
    parser.add_argument("--commands", default=",".join(COMMANDS), help="which of " + ", ".join(COMMANDS))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a command is killed")
    parser.add_argument("--profile", default="", help="commands to run under py-spy too (--endpoints form)")
    parser.add_argument(
        "--outputs", default="", help="a directory to keep each command's stdout and stderr in"
    )
    options = parser.parse_args()
    if options.outputs:
        os.makedirs(options.outputs, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the jobs' finalisers run on SIGTERM too
    print(f"CLI: {PROBING}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
    rows: List[Tuple[str, ...]] = []
    started = time.monotonic()
    try:
        for ranks in (int(text) for text in options.ranks.split(",")):
            one_size(ranks, options.nodes, rows, options)
    finally:
        print_table(rows)
        print(f"\n(whole run {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
