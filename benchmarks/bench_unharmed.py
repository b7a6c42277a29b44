"""What each probing command costs a training job's steps: how long the job is held still while
the command runs, and what four clients running it in a loop do to its step times.

Two jobs (benchmarks/unharmed_target.py, the agent started with PROBING=1): a single process
(`single`: 100 small blocks, SGD), and a 4-rank torchrun job on gloo (`ranks`: DDP with a bucket
per layer, its Flight Recorder ring full), where every command runs with `--ranks all`. Each
job has a heartbeat thread that sleeps 1 ms at a time and logs every wake-up later than 2 ms:
its lateness is how long some thread kept the GIL from it (or the machine kept the CPU from it).

For every command, two figures:

(a) one run of the command: the longest step while it ran against the longest step in an equal
    quiet window right before it (ratio and absolute), and the heartbeat's longest lateness in
    both windows. The added stall is `during - quiet`; the goal is under 10 ms.
(b) `--clients` (4) clients running the command in a loop for `--block` seconds: the 99th
    percentile of the step times, against a control of as many clients running a query over
    process.stats (which the CLI reads itself with psutil: the agent never sees it), measured
    in blocks between the commands' so that drift on a shared machine hits both alike.

The row `cpu without the gil` is no probing feature but a calibration: an eval that spends
~50 ms of CPU in each process with the GIL let go. On the 4-rank job (four processes on two
cores) it shows what any agent work costs the steps through CPU alone, GIL aside.

The figures are those of the job's worst rank (ranks), and of `--repeats` runs of (a) the
median. The table printed at the end has one line per command and job. `flamegraph` under four
clients fails by design for all but one of them (one sampling a process at a time).

The default run (one run of each command, 2 s blocks) takes about 12 minutes on this project's
2-core machine, most of it the 4-rank job's commands (`--ranks all` fans out to four agents; a
`hang` or `report` of the job takes 5-10 s); on one loaded by other work, more. `--quick` (the
single job, (a) only) takes a minute or two; `--jobs`, `--no-concurrent` and `--commands` pick
parts; `--repeats 3` steadies (a) on a machine shared with other work.

    .venv/bin/python benchmarks/bench_unharmed.py                   # both jobs, every command
    .venv/bin/python benchmarks/bench_unharmed.py --jobs single --commands memory,report
    .venv/bin/python benchmarks/bench_unharmed.py --list            # the commands' names
    .venv/bin/python benchmarks/bench_unharmed.py --no-concurrent   # (a) only: quicker
    .venv/bin/python benchmarks/bench_unharmed.py --quick           # the single job, (a) only
    .venv/bin/python benchmarks/bench_unharmed.py --save out.json   # the numbers, for a diff
    git archive HEAD probing | tar -x -C /tmp/old    # the landed agent, against this one:
    .venv/bin/python benchmarks/bench_unharmed.py --agent-from /tmp/old
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
PROBING = os.path.join(BIN, "probing")
TARGET = os.path.join(HERE, "unharmed_target.py")
CONTROL = [["query", "SELECT count(*) FROM process.stats"]]
RANKS = 4
# The tables the agent fills (process.stats is the CLI's own: the control).
TABLES = (
    "python.backtrace", "python.threads", "process.info", "process.memory", "python.gc",
    "python.gc_generations", "python.modules", "python.tensors", "python.optimizers",
    "python.torch_trace", "python.nan_events", "torch.cuda_memory", "python.collectives",
    "python.process_groups",
)  # fmt: skip


def command_specs() -> Dict[str, List[List[str]]]:
    """Name -> the CLI calls (after the PID) the command is made of, run one after the other.
    `{out}` is a fresh file in the scratch directory."""
    specs: Dict[str, List[List[str]]] = {
        "backtrace": [["backtrace"]],
        "eval": [["eval", "1 + 1"]],
        "memory": [["memory"]],
        "report": [["report", "-o", "{out}.html", "--hang-duration", "1", "--hang-samples", "3"]],
        "flamegraph": [["flamegraph", "--duration", "1", "-o", "{out}.html"]],
        "trace on/off": [["trace", "on"], ["trace", "off"]],
        "nan on/off": [["nan", "on"], ["nan", "off"]],
        "record": [["record"]],
        "hang": [["hang", "--duration", "1", "--samples", "3"]],
        # Not a probing feature: ~50 ms of CPU in each process with the GIL let go (sha256 of 20 MB),
        # what any agent work costs a job whose ranks have no idle core between them.
        "cpu without the gil": [["eval", "import hashlib; hashlib.sha256(bytes(20_000_000)).digest() and 0"]],
    }
    for table in TABLES:
        specs[f"query {table}"] = [["query", f"SELECT count(*) FROM {table}"]]
    return specs


class Job:
    """A job of unharmed_target.py with the agent in it; `pid` is rank 0's process."""

    def __init__(self, kind: str, scratch: str, agent_from: Optional[str] = None) -> None:
        self.kind = kind
        self.logdir = os.path.join(scratch, kind)
        os.makedirs(os.path.join(self.logdir, "records"), mode=0o700, exist_ok=True)
        env = dict(os.environ, PROBING="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                   PROBING_RECORD_DIR=os.path.join(self.logdir, "records"))  # fmt: skip
        if agent_from:  # the job's agent from another copy of the package (the CLI stays this one)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [agent_from, env.get("PYTHONPATH")]))
        if kind == "single":
            command = [sys.executable, TARGET, self.logdir]
            self.ranks = 1
        else:
            env["TORCH_FR_BUFFER_SIZE"] = "2000"
            command = [os.path.join(BIN, "torchrun"), "--standalone", f"--nproc-per-node={RANKS}",
                       TARGET, self.logdir, "--distributed", "--blocks", "6", "--width", "64"]  # fmt: skip
            self.ranks = RANKS
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, text=True, start_new_session=True,
        )  # fmt: skip
        self.pids: Dict[int, int] = {}
        assert self.process.stdout is not None
        deadline = time.monotonic() + 300
        while len(self.pids) < self.ranks:
            line = self.process.stdout.readline()
            if not line or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the {kind} job never got ready")
            parts = line.split()
            if len(parts) == 3 and parts[0] == "ready":
                self.pids[int(parts[1])] = int(parts[2])
        self.pid = self.pids[0]

    def argv(self, call: List[str], out: str) -> List[str]:
        call = [part.replace("{out}", out) for part in call]
        return [PROBING, str(self.pid), *call, *(["--ranks", "all"] if self.kind == "ranks" else [])]

    def alive(self) -> bool:
        return all(os.path.exists(f"/proc/{pid}") for pid in self.pids.values())

    def steps(self, start: float, end: float) -> List[float]:
        """Step durations of every rank, of the steps that ended in [start, end]."""
        return [seconds for rank in range(self.ranks) for at, seconds in _log(self.logdir, "steps", rank)
                if start <= at <= end]  # fmt: skip

    def lateness(self, start: float, end: float) -> float:
        """The heartbeat's longest wake-up gap in [start, end], less its 1 ms sleep, of any rank."""
        gaps = [seconds for rank in range(self.ranks) for at, seconds in _log(self.logdir, "beats", rank)
                if start <= at <= end]  # fmt: skip
        return max(gaps, default=0.002) - 0.001

    def kill(self) -> None:
        for pid in [*self.pids.values(), self.process.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(30)


def _log(logdir: str, kind: str, rank: int) -> List[Tuple[float, float]]:
    entries = []
    try:
        with open(os.path.join(logdir, f"{kind}-{rank}.log")) as lines:
            for line in lines:
                parts = line.split()
                if len(parts) == 2:
                    entries.append((float(parts[0]), float(parts[1])))
    except FileNotFoundError:
        pass
    return entries


class Counter:
    def __init__(self, scratch: str) -> None:
        self.scratch = scratch
        self.next = 0
        self.lock = threading.Lock()

    def out(self) -> str:
        with self.lock:
            self.next += 1
            return os.path.join(self.scratch, f"out-{self.next}")


def run_calls(job: Job, calls: List[List[str]], counter: Counter) -> Tuple[float, float, int]:
    """(start, end, the first non-zero exit code or 0) of one run of a command."""
    start = time.time()
    code = 0
    for call in calls:
        done = _run(job.argv(call, counter.out()))
        code = code or done.returncode
        if done.returncode not in (0,):
            sys.stderr.write(f"  [{job.kind}] {' '.join(call)}: exit {done.returncode}: "
                             f"{done.stderr.decode(errors='replace').strip()[-300:]}\n")  # fmt: skip
    return start, time.time(), code


def _run(argv: List[str]) -> subprocess.CompletedProcess[bytes]:
    """One CLI call. The CLI may be missing for a moment while it is reinstalled (a machine shared
    by several people working on probing): it is waited for, a minute at most."""
    for _ in range(60):
        try:
            return subprocess.run(argv, capture_output=True, timeout=120)
        except FileNotFoundError:
            time.sleep(1)
    return subprocess.run(argv, capture_output=True, timeout=120)


class Single(NamedTuple):
    quiet_s: float  # longest step in the quiet window
    during_s: float  # longest step while the command ran
    quiet_late_s: float  # heartbeat's longest lateness, quiet
    during_late_s: float  # and while the command ran
    command_s: float  # how long the command took
    failed: int


# How long a first run of a command takes, roughly: the quiet window before it must be as long.
EXPECTED_S = {"report": 5.0, "flamegraph": 3.0, "hang": 3.0, "memory": 2.0, "record": 2.0}


def measure_single(name: str, job: Job, calls: List[List[str]], repeats: int, counter: Counter) -> Single:
    runs = []
    failed = 0
    quiet = max(1.0, EXPECTED_S.get(name.split()[0], 1.0) * (2 if job.kind == "ranks" else 1))
    for _ in range(repeats):
        time.sleep(quiet)
        start, end, code = run_calls(job, calls, counter)
        failed += code != 0
        # The quiet window is as long as the command took, or what the sleep left of it.
        runs.append((max(start - (end - start), start - quiet + 0.05), start, end))
        quiet = max(1.0, min(end - start, 20.0) + 0.2)
    time.sleep(0.4)  # the logs are flushed by the job every step and every 0.1 s
    figures = []
    for quiet_from, start, end in runs:
        figures.append((
            max(job.steps(quiet_from, start), default=float("nan")),
            max(job.steps(start, end + 0.02), default=float("nan")),
            job.lateness(quiet_from, start), job.lateness(start, end + 0.02), end - start,
        ))  # fmt: skip
    quiet_s, during_s, quiet_late_s, during_late_s, command_s = (
        statistics.median(column) for column in zip(*figures)
    )
    return Single(quiet_s, during_s, quiet_late_s, during_late_s, command_s, failed)


def run_clients(
    job: Job, calls: List[List[str]], seconds: float, clients: int, counter: Counter
) -> Tuple[int, int]:
    """(runs, failed runs) of `clients` clients looping the command for `seconds`."""
    deadline = time.monotonic() + seconds
    results: List[int] = []

    def client() -> None:
        while time.monotonic() < deadline:
            results.append(run_calls(job, calls, counter)[2])

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(results), sum(1 for code in results if code)


def p99(steps: Sequence[float]) -> float:
    if not steps:
        return float("nan")
    ordered = sorted(steps)
    return ordered[int(0.99 * (len(ordered) - 1))]


class Concurrent(NamedTuple):
    p99_s: float
    late_s: float
    runs: int
    failed: int


def measure_concurrent(
    job: Job, calls: List[List[str]], seconds: float, clients: int, counter: Counter
) -> Concurrent:
    start = time.time()
    runs, failed = run_clients(job, calls, seconds, clients, counter)
    end = time.time()
    time.sleep(0.4)
    # The first half second: the clients' own start-up, the same in every block.
    return Concurrent(p99(job.steps(start + 0.5, end)), job.lateness(start + 0.5, end), runs, failed)


def bench_job(kind: str, names: List[str], options: argparse.Namespace, scratch: str) -> Dict[str, Any]:
    specs = command_specs()
    counter = Counter(scratch)
    job = Job(kind, scratch, options.agent_from)
    results: Dict[str, Any] = {"commands": {}, "controls": []}
    try:
        time.sleep(2)  # warm-up steps are not measured
        quiet = job.steps(time.time() - 1.5, time.time())
        results["quiet_median_s"] = statistics.median(quiet) if quiet else None
        for name in names:
            single = measure_single(name, job, specs[name], options.repeats, counter)
            results["commands"][name] = {"single": single._asdict()}
            print(
                f"  [{kind}] {name:<30} longest step {single.quiet_s * 1e3:6.1f} -> "
                f"{single.during_s * 1e3:6.1f} ms  heartbeat late {single.quiet_late_s * 1e3:5.1f} -> "
                f"{single.during_late_s * 1e3:5.1f} ms  ({single.command_s:.1f} s)", flush=True,
            )  # fmt: skip
        if options.concurrent:
            for index, name in enumerate(names):
                if index % 3 == 0:
                    control = measure_concurrent(job, CONTROL, options.block, options.clients, counter)
                    results["controls"].append(control._asdict())
                concurrent = measure_concurrent(job, specs[name], options.block, options.clients, counter)
                results["commands"][name]["concurrent"] = concurrent._asdict()
                print(
                    f"  [{kind}] {name:<30} p99 under {options.clients} clients "
                    f"{concurrent.p99_s * 1e3:6.1f} ms  ({concurrent.runs} runs, {concurrent.failed} failed)",
                    flush=True,
                )  # fmt: skip
            control = measure_concurrent(job, CONTROL, options.block, options.clients, counter)
            results["controls"].append(control._asdict())
        results["alive"] = job.alive()
    finally:
        job.kill()
    return results


def print_table(results: Dict[str, Dict[str, Any]], names: List[str]) -> None:
    print()
    print("command                          job     quiet   during  added   ratio | heartbeat late     "
          "| p99     control  ratio  (fails)")  # fmt: skip
    print("                                         longest step (ms)               | quiet  during (ms) "
          "| under 4 clients (ms)")  # fmt: skip
    for name in names:
        for kind, result in results.items():
            entry = result["commands"].get(name)
            if entry is None:
                continue
            single = entry["single"]
            line = (
                f"{name:<32} {kind:<7} {single['quiet_s'] * 1e3:6.1f}  {single['during_s'] * 1e3:6.1f}  "
                f"{(single['during_s'] - single['quiet_s']) * 1e3:+6.1f}  "
                f"x{single['during_s'] / single['quiet_s']:4.1f} "
                f"| {single['quiet_late_s'] * 1e3:5.1f}  {single['during_late_s'] * 1e3:6.1f}     "
            )
            concurrent = entry.get("concurrent")
            controls = [c["p99_s"] for c in result["controls"] if not math.isnan(c["p99_s"])]
            if concurrent is not None and controls:
                control = statistics.median(controls)
                line += (
                    f"| {concurrent['p99_s'] * 1e3:6.1f}  {control * 1e3:6.1f}  "
                    f"x{concurrent['p99_s'] / control:4.2f}"
                    f"  ({concurrent['failed']}/{concurrent['runs']})"
                )
            if single["failed"]:
                line += f"  [{single['failed']} single run(s) failed]"
            print(line)
    for kind, result in results.items():
        median = result.get("quiet_median_s")
        print(f"  {kind}: median quiet step {median * 1e3 if median else float('nan'):.1f} ms; "
              f"job alive afterwards: {result.get('alive')}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", default="single,ranks", help="single, ranks or both (comma-separated)")
    parser.add_argument("--commands", default="all", help="comma-separated names (--list), or all")
    parser.add_argument("--list", action="store_true", help="print the commands' names and exit")
    parser.add_argument("--repeats", type=int, default=1, help="single runs of each command (a)")
    parser.add_argument("--block", type=float, default=2.0, help="seconds of each concurrent block (b)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--no-concurrent", dest="concurrent", action="store_false", help="skip (b)")
    parser.add_argument("--quick", action="store_true", help="the single job only, (a) only: a minute or two")
    parser.add_argument("--save", help="write the numbers to this JSON file")
    parser.add_argument(
        "--agent-from", metavar="DIR",
        help="start the jobs with the probing package in DIR on their PYTHONPATH (an older checkout's "
        "agent, say, to compare in the same conditions; the CLI is this one)",
    )  # fmt: skip
    options = parser.parse_args()
    specs = command_specs()
    if options.list:
        print("\n".join(specs))
        return 0
    names = list(specs)
    if options.commands != "all":
        names = [name.strip() for name in options.commands.split(",")]
    unknown = [name for name in names if name not in specs]
    if unknown:
        parser.error(f"unknown command(s) {', '.join(unknown)}; --list shows them")
    if options.quick:
        options.jobs, options.concurrent = "single", False
    jobs = [kind.strip() for kind in options.jobs.split(",")]
    load = os.getloadavg()
    print(
        f"CPU {os.cpu_count()} cores, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {options.repeats} "
        f"single run(s) per command, {options.clients} clients x {options.block:g} s"
    )
    results: Dict[str, Dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for kind in jobs:
            results[kind] = bench_job(kind, names, options, scratch)
    print_table(results, names)
    if options.save:
        with open(options.save, "w") as saved:
            json.dump({"load": load, "results": results}, saved, indent=1)
    return 0 if all(result.get("alive") for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
