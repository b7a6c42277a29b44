"""`probing core CORE` against the reader's own CLI (`pystack core CORE`) on the same core, in the
same run (medians, interleaved); on the kernel's core, `py-spy dump --core` too, which reads
those (not gcore's).

    .venv/bin/python benchmarks/bench_core_files.py [--runs 15]

1. a core written by the kernel: tests/targets/segfaults.py crashed under `ulimit -c unlimited`
2. a core written by gcore of a live tests/targets/waiters.py (four threads)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
TARGETS = HERE.parent / "tests" / "targets"
BIN = Path(sys.executable).parent
PROBING, PYSTACK, PY_SPY = str(BIN / "probing"), str(BIN / "pystack"), str(BIN / "py-spy")


def kernel_core(directory: Path) -> Path:
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or "/" in pattern:
        raise SystemExit(f"core_pattern is {pattern!r}: the kernel writes no core into the working directory")
    script = 'ulimit -c "$(ulimit -H -c)" && exec "$@"'
    command = ["sh", "-c", script, "sh", sys.executable, str(TARGETS / "segfaults.py")]
    subprocess.run(command, cwd=directory, capture_output=True)
    prefix = pattern.split("%")[0] or "core"
    cores = [path for path in directory.iterdir() if path.name.startswith(prefix)]
    if not cores:
        raise SystemExit("the kernel wrote no core (ulimit -H -c is 0?)")
    return cores[0]


def gcore(directory: Path) -> Path:
    target = subprocess.Popen(
        [sys.executable, str(TARGETS / "waiters.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert target.stdout is not None
        if not target.stdout.readline().startswith(b"ready"):
            raise SystemExit("waiters.py did not start")
        subprocess.run(
            ["gcore", "-o", str(directory / "gcore"), str(target.pid)], capture_output=True, check=True
        )
        return directory / f"gcore.{target.pid}"
    finally:
        target.kill()
        target.wait()


def medians(commands: Dict[str, List[str]], runs: int) -> Dict[str, float]:
    for command in commands.values():
        result = subprocess.run(command, capture_output=True)  # warm: the page cache holds the core
        if result.returncode != 0:
            raise RuntimeError(f"{command}: {result.stderr.decode()}")
    times: Dict[str, List[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            started = time.perf_counter()
            subprocess.run(command, capture_output=True)
            times[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def report(title: str, core: Path, commands: Dict[str, List[str]], runs: int) -> None:
    times = medians(commands, runs)
    baseline = times["pystack core"]
    print(f"\n{title} ({core.stat().st_size / 1e6:.0f} MB), median of {runs} runs:")
    for name, milliseconds in times.items():
        print(f"  {name:<32} {milliseconds:8.1f} ms   x{milliseconds / baseline:.2f} of pystack core")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    directory = Path(tempfile.mkdtemp(prefix="bench-core-"))
    os.chdir(directory)  # pystack's CLI and probing read the same core, from anywhere
    try:
        crashed = kernel_core(directory)
        report(
            "kernel core of a crashed process (segfaults.py)",
            crashed,
            {
                "probing core CORE": [PROBING, "core", str(crashed)],
                "probing core CORE --format json": [PROBING, "core", str(crashed), "--format", "json"],
                "pystack core": [PYSTACK, "core", str(crashed)],
                "py-spy dump --core": [PY_SPY, "dump", "--core", str(crashed)],
            },
            runs,
        )
        if shutil.which("gcore") is None:
            print("\ngcore is not installed: no gcore measurement")
            return
        copied = gcore(directory)
        report(
            "gcore of a live process (waiters.py, 4 threads)",
            copied,
            {
                "probing core CORE": [PROBING, "core", str(copied)],
                "pystack core": [PYSTACK, "core", str(copied)],
            },
            runs,
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
