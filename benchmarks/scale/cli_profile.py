"""Where the CLI spends its time on a big job: one command run under py-spy (every thread of the
CLI, sampled; `--idle` off, so what shows is CPU, not waiting), summarised by the phases of a
`--ranks all` command.

    .venv/bin/python benchmarks/scale/cli_profile.py --ranks 256 --nodes 4 [--command backtrace]
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
from pathlib import Path
from typing import Counter, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import measure  # noqa: E402
from run import COMMANDS  # noqa: E402
from scale_job import BIN, PROBING, ScaleJob  # noqa: E402

# Phase -> functions (py-spy's "qualname (file:line)" without the place) whose samples, anywhere
# below them in a stack, are that phase's. The first phase of a stack that matches wins.
PHASES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("DuckDB view of every rank (SqlSession._add_part)", ("SqlSession._add_part",)),
    ("DuckDB staging and query (SqlSession.load/run)", ("SqlSession.load", "SqlSession.run")),
    ("connect, handshake, hello (per rank)", ("Target.connect", "Client.__init__")),
    (
        "request, reply, decode (per rank)",
        ("Client.call", "Client.fetch_table", "fetch_tables", "read_reply"),
    ),
    ("job discovery (/proc, registry)", ("find_job", "with_remote_ranks", "ask_registry")),
    ("folding and rendering", ("write_job_stacks", "write_folded", "fold", "write_rows", "write_table")),
    ("imports", ("_find_and_load",)),
)
SAMPLE_RATE = 200


def _function(frame: str) -> str:
    return re.sub(r" \([^()]*:\d+\)$", "", frame)


def summarise(raw: str) -> Tuple[int, Counter[str], Counter[str]]:
    """Samples, per phase, and per innermost function, from py-spy's raw (folded) output."""
    phases: Counter[str] = collections.Counter()
    innermost: Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count, functions = int(count_text), [_function(frame) for frame in stack.split(";")]
        total += count
        innermost[stack.split(";")[-1]] += count
        phase = next((name for name, names in PHASES if any(f in names for f in functions)), "other")
        phases[phase] += count
    return total, phases, innermost


def profile(job: ScaleJob, args: List[str]) -> Dict[str, object]:
    """`probing ARGS` (its target first) in node 0 under py-spy."""
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as output:
        spy = [str(BIN / "py-spy"), "record", "-r", str(SAMPLE_RATE), "--format", "raw", "-o", output.name,
               "--", PROBING, *args]  # fmt: skip
        result = measure(job.nodes[0].command(spy), job.cli_environment(), 1800)
        raw = output.read()
    total, phases, innermost = summarise(raw)
    return {"seconds": result.seconds, "exit": result.returncode, "samples": total, "phases": phases,
            "innermost": innermost}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--command", action="append", choices=sorted(COMMANDS))
    parser.add_argument("--endpoints", action="store_true", help="--endpoints @FILE, not the store")
    options = parser.parse_args()
    with ScaleJob(options.ranks, options.nodes, ready_timeout=1800) as job:
        target = ["--endpoints", f"@{job.endpoints_file()}"] if options.endpoints else ["1"]
        for name in options.command or ["backtrace", "query"]:
            report(
                f"{name} at {options.ranks} ranks / {options.nodes} nodes",
                profile(job, [*target, *COMMANDS[name]]),
            )


def report(title: str, found: Dict[str, object]) -> None:
    samples = int(str(found["samples"])) or 1
    print(f"\n{title}: {found['seconds']:.2f} s wall, exit {found['exit']}, "
          f"{samples} samples (thread-seconds x {SAMPLE_RATE}) of CPU")  # fmt: skip
    phases: Counter[str] = found["phases"]  # type: ignore[assignment]
    for phase, count in phases.most_common():
        print(f"   {count / SAMPLE_RATE:7.2f} s  {100 * count / samples:5.1f} %  {phase}")
    innermost: Counter[str] = found["innermost"]  # type: ignore[assignment]
    print("   innermost functions:")
    for frame, count in innermost.most_common(8):
        print(f"   {count / SAMPLE_RATE:7.2f} s  {frame}")


if __name__ == "__main__":
    main()
