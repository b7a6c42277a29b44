"""Soak: attach, eval, query and detach, over and over, against jobs that check themselves.

For every CPython on the machine (3.8-3.15 and Debian's 3.11) and every kind of job, N cycles of

    probing PID inject -> probing PID eval CODE -> probing PID query SQL -> probing PID detach

where the query reads python.modules, on the job that trains with torch (the venv's Python, the
only one here with torch); the other jobs have no model tables, and skip it. The jobs
(tests/targets/selfcheck.py) recompute floating-point and heap results every step and exit 3 on
any difference; the printing job's lines must come out whole and in order. Prints one line
per interpreter and job kind: cycles, crashed jobs, jobs whose results or output changed,
failed commands; exits 1 if any of those is not zero.

    python benchmarks/soak.py --cycles 200            # make soak
    python benchmarks/soak.py --cycles 3 --quick      # the short version in make test
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "..", "tests", "targets", "selfcheck.py")
PROBING = os.path.join(os.path.dirname(sys.executable), "probing")
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

# The interpreters the integration tests run targets under (3.14 and 3.15: `make pythons`).
from support import INTERPRETER_PATTERNS as INTERPRETERS  # noqa: E402

# Job kinds: the selfcheck flags, and whether the job needs torch.
KINDS = {
    "print": (["--print", "--spin"], False),
    "gc": (["--gc-thread"], False),
    "train": (["--torch", "--print"], True),
}
COMMAND_TIMEOUT_S = 60.0


class Outcome:
    def __init__(self, name: str) -> None:
        self.name = name
        self.cycles = 0
        self.crashed = 0
        self.changed = 0
        self.failed: List[str] = []

    def line(self) -> str:
        return (
            f"{self.name:<22} cycles {self.cycles:>4}  crashed jobs {self.crashed}  "
            f"changed results/output {self.changed}  failed commands {len(self.failed)}"
        )

    @property
    def clean(self) -> bool:
        return not (self.crashed or self.changed or self.failed)


def find(pattern: str) -> Optional[str]:
    matches = sorted(glob.glob(os.path.expanduser(pattern)))
    return matches[-1] if matches else None


def probing(*args: str) -> Tuple[int, str]:
    environment = dict(os.environ)
    environment.pop("PROBING", None)
    try:
        done = subprocess.run(
            [PROBING, *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, env=environment
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {COMMAND_TIMEOUT_S:g} s"
    return done.returncode, done.stderr.strip()[-400:]


def start(python: str, flags: List[str], log: str) -> subprocess.Popen:  # type: ignore[type-arg]
    out = open(log, "w")  # noqa: SIM115 - the job writes it until it exits
    job = subprocess.Popen(
        [python, TARGET, *flags], stdin=subprocess.PIPE, stdout=out, stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(log) as text:
            if "ready" in text.read():
                return job
        if job.poll() is not None:
            break
        time.sleep(0.05)
    job.kill()
    raise RuntimeError(f"{python} {TARGET} {flags} never said ready")


def soak(name: str, python: str, kind: str, cycles: int, torch: bool) -> Outcome:
    flags, _ = KINDS[kind]
    outcome = Outcome(f"{name} {kind}")
    with tempfile.TemporaryDirectory() as scratch:
        log = os.path.join(scratch, "job.out")
        job = start(python, flags, log)
        pid = str(job.pid)
        steps: List[Tuple[str, ...]] = [("inject",), ("eval", "print('soak'); step")]
        if torch:
            steps.append(("query", "SELECT name, grad_norm FROM python.modules"))
        steps.append(("detach",))
        try:
            for _ in range(cycles):
                for args in steps:
                    code, why = probing(pid, *args)
                    if code != 0:
                        outcome.failed.append(f"{args[0]}: exit {code}: {why}")
                if job.poll() is not None:
                    break
                outcome.cycles += 1
            ended_early = job.poll() is not None
            if not ended_early:
                assert job.stdin is not None
                job.stdin.close()
                try:
                    job.wait(30)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.wait(10)
            errors = job.stderr.read().decode("utf-8", "replace") if job.stderr else ""
            mismatch = "MISMATCH" in errors
            if ended_early or job.returncode not in (0, 3):
                outcome.crashed += 1
                outcome.failed.append(f"job exit {job.returncode}: {errors.strip()[-400:]}")
            with open(log) as text:
                output = text.read().splitlines()
            numbers = [int(line.split()[1]) for line in output if line.startswith("line ")]
            in_order = numbers == list(range(len(numbers)))
            finished = any(line.startswith("steps ") and line.endswith(" ok") for line in output)
            leaked = any("soak" in line for line in output)  # eval's print reached the job's stdout
            if mismatch or not in_order or leaked or (not finished and not outcome.crashed):
                outcome.changed += 1
        finally:
            if job.poll() is None:
                job.kill()
                job.wait(10)
    return outcome


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="one plain interpreter and the torch job only")
    parser.add_argument("--only", default=None, help="interpreter names, comma-separated (3.8,venv)")
    parser.add_argument("--parallel", type=int, default=1, help="jobs soaked at the same time")
    options = parser.parse_args(argv)
    plans: List[Tuple[str, str, str, bool]] = []
    only = set(options.only.split(",")) if options.only else None
    for name, pattern in INTERPRETERS.items():
        if only and name not in only:
            continue
        python = find(pattern)
        if python is None:
            print(f"{name:<22} skipped: no interpreter at {pattern}")
            continue
        if options.quick and name not in ("3.8", "debian-3.11"):
            continue
        for kind, (_, needs_torch) in KINDS.items():
            if not needs_torch:
                plans.append((name, python, kind, False))
    if not only or "venv" in only:
        plans.append(("venv", sys.executable, "train", True))
    outcomes: Dict[str, Outcome] = {}
    started = time.monotonic()

    def one(plan: Tuple[str, str, str, bool]) -> None:
        outcome = soak(*plan[:3], options.cycles, plan[3])
        outcomes[outcome.name] = outcome
        print(outcome.line(), flush=True)
        for failure in outcome.failed[:5]:
            print(f"    {failure}", flush=True)

    with ThreadPoolExecutor(max(1, options.parallel)) as pool:
        list(pool.map(one, plans))
    total = sum(outcome.cycles for outcome in outcomes.values())
    bad = [outcome for outcome in outcomes.values() if not outcome.clean]
    print(
        f"soak: {total} cycles over {len(outcomes)} jobs in {time.monotonic() - started:.0f} s; "
        f"{sum(o.crashed for o in outcomes.values())} crashed, {sum(o.changed for o in outcomes.values())} "
        f"changed, {sum(len(o.failed) for o in outcomes.values())} failed commands"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
