"""What listening on TCP costs an idle job: CPU time and RSS with the listener on vs off.

Three copies of the same idle target (tests/targets/sleeper.py, the agent started by PROBING=1)
run side by side, so that drift on a shared machine hits each alike:

- off:        the agent on its Unix socket only;
- on:         PROBING_LISTEN=127.0.0.1:0 with a token: the listener thread in a blocking select;
- on, rank:   the same, in a process that looks like a torchrun rank that never imports torch
              (RANK, WORLD_SIZE, MASTER_ADDR/PORT set): its registration retries every 5 s at most.

Reported: process CPU time (user + system) over the idle window, RSS at its end, and the ratios
of each "on" to "off". The memory sampler runs in all three (it is on by default).

    .venv/bin/python benchmarks/bench_listener.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "..", "tests", "targets", "sleeper.py")
TOKEN = "bench-listener-token-0123456789"
MODES: Dict[str, Dict[str, str]] = {
    "off": {},
    "on": {"PROBING_LISTEN": "127.0.0.1:0", "PROBING_TOKEN": TOKEN},
    "on, rank": {
        "PROBING_LISTEN": "127.0.0.1:0", "PROBING_TOKEN": TOKEN, "RANK": "0", "LOCAL_RANK": "0",
        "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9",
    },
}  # fmt: skip


def cpu_and_switches(pid: int) -> Tuple[float, int]:
    """(CPU seconds, context switches) summed over the process's threads, in nanoseconds from
    schedstat: an idle agent spends far less than the clock tick that /proc/PID/stat counts in."""
    seconds, switches = 0.0, 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as schedstat:
                seconds += int(schedstat.read().split()[0]) / 1e9
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    if "ctxt_switches:" in line:  # voluntary (wake-ups) and involuntary
                        switches += int(line.split()[1])
        except OSError:
            pass  # a thread that ended meanwhile
    return seconds, switches


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def start(extra: Dict[str, str], socket_dir: str) -> subprocess.Popen:  # type: ignore[type-arg]
    env = dict(os.environ, PROBING="1", PYTHONUNBUFFERED="1", PROBING_SOCKET_DIR=socket_dir, **extra)
    process = subprocess.Popen(
        [sys.executable, TARGET],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert process.stdout is not None
    for line in iter(process.stdout.readline, b""):
        if line.startswith(b"ready"):
            return process
    raise RuntimeError("the target never said ready")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    options = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-listener-") as socket_dir:
        processes = {mode: start(extra, socket_dir) for mode, extra in MODES.items()}
        try:
            time.sleep(1.0)  # past start-up: the idle window only
            before = {mode: cpu_and_switches(process.pid) for mode, process in processes.items()}
            time.sleep(options.seconds)
            results: List[Tuple[str, float, int, float]] = []
            for mode, process in processes.items():
                cpu, switches = cpu_and_switches(process.pid)
                results.append((mode, cpu - before[mode][0], switches - before[mode][1], rss_mb(process.pid)))
        finally:
            for process in processes.values():
                process.kill()
                process.wait(10)
    print(f"idle agent over {options.seconds:g} s: process CPU time, context switches, RSS; ratios to off")
    off_cpu, off_rss = results[0][1], results[0][3]
    for mode, spent, switches, rss in results:
        share = spent / options.seconds * 100
        print(
            f"  {mode:<9} CPU {spent * 1e3:7.2f} ms ({share:.4f} % of a core, {spent / off_cpu:5.2f}x),"
            f" {switches:4d} switches;  RSS {rss:6.1f} MB ({rss / off_rss:.3f}x, {rss - off_rss:+.2f} MB)"
        )


if __name__ == "__main__":
    main()
