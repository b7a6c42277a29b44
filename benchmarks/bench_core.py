"""The core measurements, each against a baseline taken in the same run.

    .venv/bin/python benchmarks/bench_core.py [--runs 30] [--idle-seconds 60] [--backtraces 100]

1. warm `probing PID backtrace` wall time vs `py-spy dump --pid PID` (medians, interleaved)
2. the agent's idle CPU over --idle-seconds, and the RSS it adds to the process
3. the longest gap a heartbeat thread in the target sees while backtraces run back to
   back, vs the same window with nothing running
4. what the .pth file costs an interpreter started without PROBING
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path
from typing import Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PROBING = str(BIN / "probing")
PY_SPY = str(BIN / "py-spy")
SLEEPER = str(ROOT / "tests" / "targets" / "sleeper.py")
HEARTBEAT = str(Path(__file__).resolve().parent / "heartbeat_target.py")


class Job:
    """A target process; `agent` starts it under `probing run`."""

    def __init__(self, script: str, agent: bool, args: Optional[List[str]] = None) -> None:
        command = [sys.executable, script, *(args or [])]
        if agent:
            command = [PROBING, "run", "--", *command]
        env = {key: value for key, value in os.environ.items() if key != "PROBING"}
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        assert self.process.stdout is not None and self.process.stderr is not None
        ready = self.process.stdout.readline().decode()
        if not ready.startswith("ready"):
            raise RuntimeError(f"{script} did not start: {ready!r}")
        self.pid = self.process.pid
        if agent:
            line = self.process.stderr.readline().decode()
            self.pid = int(line.split("PID ")[1].split(":")[0])

    def eval(self, code: str) -> str:
        result = subprocess.run([PROBING, str(self.pid), "eval", code], capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(result.stderr)
        return result.stdout

    def stop(self) -> None:
        self.process.kill()
        if self.pid != self.process.pid:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass
        self.process.wait()


def wall_ms(command: List[str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = (time.perf_counter() - started) * 1000
    if result.returncode:
        raise RuntimeError(f"{command} failed: {result.stderr.decode()}")
    return elapsed


def backtrace_vs_py_spy(runs: int) -> Dict[str, float]:
    job = Job(SLEEPER, agent=True)
    try:
        commands = {
            "probing backtrace": [PROBING, str(job.pid), "backtrace"],
            "py-spy dump": [PY_SPY, "dump", "--pid", str(job.pid)],
            "python -c pass": [sys.executable, "-c", "pass"],
        }
        for command in commands.values():  # warm: page cache, the agent's first-connection imports
            wall_ms(command)
        times: Dict[str, List[float]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, command in commands.items():
                times[name].append(wall_ms(command))
    finally:
        job.stop()
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"\n1. warm backtrace wall time, median of {runs} runs each, interleaved")
    for name, median in medians.items():
        print(f"   {name:<20} {median:7.1f} ms   (min {min(times[name]):.1f}, max {max(times[name]):.1f})")
    ratio = medians["probing backtrace"] / medians["py-spy dump"]
    print(f"   ratio probing / py-spy: {ratio:.2f}x   (bare interpreter / py-spy: "
          f"{medians['python -c pass'] / medians['py-spy dump']:.2f}x)")  # fmt: skip
    return {"ratio": ratio, **medians}


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _cpu_ticks(path: str) -> int:
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def idle_cost(seconds: float) -> None:
    plain = Job(SLEEPER, agent=False)
    idle_agent = Job(SLEEPER, agent=True)
    used_agent = Job(SLEEPER, agent=True)
    try:
        subprocess.run([PROBING, str(used_agent.pid), "backtrace"], capture_output=True, check=True)
        subprocess.run([PROBING, str(used_agent.pid), "query", "SELECT * FROM python.threads"],
                       capture_output=True, check=True)  # fmt: skip
        # The agent's threads are not threading's: the OS names them (probing/agent/threads.py).
        agent_tid = next(
            int(task)
            for task in os.listdir(f"/proc/{used_agent.pid}/task")
            if Path(f"/proc/{used_agent.pid}/task/{task}/comm").read_text().strip() == "probing-agent"
        )
        time.sleep(0.5)  # let the connection threads of those commands finish
        rss = {"none": _rss_kb(plain.pid), "idle": _rss_kb(idle_agent.pid), "used": _rss_kb(used_agent.pid)}
        ticks_per_s = os.sysconf("SC_CLK_TCK")
        before_thread = _cpu_ticks(f"/proc/{used_agent.pid}/task/{agent_tid}/stat")
        before_process = {job.pid: _cpu_ticks(f"/proc/{job.pid}/stat") for job in (plain, used_agent)}
        time.sleep(seconds)
        thread_ticks = _cpu_ticks(f"/proc/{used_agent.pid}/task/{agent_tid}/stat") - before_thread
        process_ticks = {
            pid: _cpu_ticks(f"/proc/{pid}/stat") - ticks for pid, ticks in before_process.items()
        }
    finally:
        for job in (plain, idle_agent, used_agent):
            job.stop()
    print(f"\n2. idle cost over {seconds:g} s")
    print(f"   probing-agent thread CPU: {thread_ticks / ticks_per_s * 1000:.0f} ms "
          f"({thread_ticks} ticks of 1/{ticks_per_s} s)")  # fmt: skip
    print(f"   whole process CPU, agent vs none: {process_ticks[used_agent.pid]} vs "
          f"{process_ticks[plain.pid]} ticks")  # fmt: skip
    print(f"   RSS without an agent: {rss['none'] / 1024:.1f} MB")
    print(f"   RSS added by an agent never contacted: {(rss['idle'] - rss['none']) / 1024:.2f} MB")
    print(f"   RSS added after backtrace, eval, query: {(rss['used'] - rss['none']) / 1024:.2f} MB")


def heartbeat(count: int, busy: bool) -> None:
    job = Job(HEARTBEAT, agent=True, args=["busy"] if busy else [])
    try:
        job.eval("reset()")
        started = time.perf_counter()
        for _ in range(count):
            subprocess.run([PROBING, str(job.pid), "backtrace"], stdout=subprocess.DEVNULL, check=True)
        window = time.perf_counter() - started
        under_load = json.loads(job.eval("print(report())"))
        job.eval("reset()")
        time.sleep(window)
        baseline = json.loads(job.eval("print(report())"))
        # The same load from one persistent connection: the agent's side alone, back to back.
        code = (
            "import time\nfrom probing.client.connection import Client\nimport probing.agent as agent\n"
            "reset()\nwith Client(agent.socket_path(), 5) as client:\n"
            "    started = time.perf_counter()\n    for _ in range(COUNT): client.backtrace({})\n"
            "    elapsed = time.perf_counter() - started\n"
            "print(elapsed * 1000 / COUNT)"
        ).replace("COUNT", str(count))
        per_call_ms = float(job.eval(code))
        in_process = json.loads(job.eval("print(report())"))
        # How long the agent itself holds the GIL for one backtrace: its handler makes no
        # system call, so it holds the GIL from start to end (unless preempted).
        held = (
            "import time, probing.agent as agent\nfrom probing.protocol.frames import Frame\n"
            "from probing.protocol.messages import request\n"
            "from probing.agent.handlers import Dispatcher\n"
            "dispatcher = Dispatcher(agent._server)\n"
            "frame = Frame(request(1, 'backtrace', {}), bytearray())\n"
            "times = []\nfor _ in range(COUNT):\n    started = time.perf_counter()\n"
            "    dispatcher.handle(frame)\n    times.append(time.perf_counter() - started)\n"
            "times.sort()\nprint(times[len(times) // 2] * 1000, times[-1] * 1000)"
        ).replace("COUNT", str(count))
        held_median, held_max = map(float, job.eval(held).split())
    finally:
        job.stop()
    kind = "busy (pure-Python loop in the main thread)" if busy else "idle main thread"
    print(f"\n3. heartbeat thread (sleeps 1 ms), {kind}")
    print(f"   {count} CLI backtraces back to back ({window:.2f} s): "
          f"longest gap {under_load['max_ms']:.2f} ms, p99 {under_load['p99_ms']:.2f} ms")  # fmt: skip
    print(f"   same window, nothing running:          longest gap {baseline['max_ms']:.2f} ms, "
          f"p99 {baseline['p99_ms']:.2f} ms")  # fmt: skip
    print(f"   {count} backtraces on one connection from inside ({per_call_ms:.2f} ms each): "
          f"longest gap {in_process['max_ms']:.2f} ms, p99 {in_process['p99_ms']:.2f} ms")  # fmt: skip
    print(f"   time the agent holds the GIL per backtrace (its handler, timed inside): "
          f"median {held_median:.3f} ms, max {held_max:.3f} ms")  # fmt: skip


def pth_cost(runs: int) -> None:
    site_packages = Path(next(p for p in sys.path if p.endswith("site-packages")))
    line = (site_packages / "probing-autostart.pth").read_text().strip()
    env = {key: value for key, value in os.environ.items() if key != "PROBING"}
    per_exec = min(timeit.repeat(lambda: exec(line, {}), number=10000, repeat=5)) / 10000 * 1e6
    imported = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True,
                              text=True, env=env).stderr  # fmt: skip
    probing_modules = [row for row in imported.splitlines() if "probing" in row]
    print("\n4. probing-autostart.pth with PROBING unset")
    print(f"   executing its line: {per_exec:.2f} us; modules of probing imported (-X importtime): "
          f"{len(probing_modules)}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--backtraces", type=int, default=100)
    options = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}")
    steps: List[Callable[[], object]] = [
        lambda: backtrace_vs_py_spy(options.runs),
        lambda: idle_cost(options.idle_seconds),
        lambda: heartbeat(options.backtraces, busy=False),
        lambda: heartbeat(options.backtraces, busy=True),
        lambda: pth_cost(options.runs),
    ]
    for step in steps:
        step()


if __name__ == "__main__":
    main()
