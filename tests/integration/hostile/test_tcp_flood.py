"""A pre-auth connection flood against a job's TCP listener (issue 25, item 10): while peers that
do not know the token connect as fast as they can (silent, garbage, trickling: tcp_flooder.py),
every `probing tcp://... eval` with the token gets through in time, the job's own work is not
held still, and the agent's threads and descriptors stay bounded.

Before the fix the listener dropped the oldest of its 64 handshakes for each newcomer: 12 to 19
of the 20 clients failed on this project's 2-core machine ("Connection reset by peer");
docs/decisions.md has the figures before and after.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

import pytest

from probing.agent.listener import handshakes

from support import PROBING, VENV_PYTHON, Target, listener_of

# The flood takes every core it can get, and the clients' times are compared with their own
# times without it and the job's heartbeat bounded: it runs alone, after the parallel part.
pytestmark = pytest.mark.serial

TOKEN = secrets.token_hex(16)
FLOODER = str(Path(__file__).resolve().parent / "tcp_flooder.py")
LEGIT_CLIENTS = 20
CLIENTS_AT_ONCE = 4
# Each client's whole command, from start to exit, must end within this many times the slowest
# of the same clients without the flood (measured first, in the same test: the flooder takes a
# core, and a loaded machine starts a CLI slowly whatever the agent does), plus the allowance:
# a SYN dropped by a full accept queue (the CLI connects afresh after 0.25, 0.5, 1, 2 s) and
# resets retried before a verdict (1.5 s of pauses).
SLOWER_UNDER_FLOOD = 2.0
FLOOD_ALLOWANCE_S = 8.0
LEGIT_HARD_LIMIT_S = 60.0
# Connects per second at most, from one flooder process over its source addresses in turn: the
# issue's rate; a slower machine floods as fast as it can.
FLOOD_RATE = 10_000
FLOOD_LIMIT_S = 120  # every flooder stops by itself by then, whatever the test does
FLOOD_MAX_CONNECTS = 2_000_000
# The longest the job's heartbeat may be held still during the flood, not counting its own wait
# for a core (the flooder, the clients and the agent share this machine's cores, with other
# work). What is left is the wait for the GIL: a few switch intervals (5 ms) when the listener
# runs, more when the scheduler preempts it holding the GIL on a loaded machine (up to a quarter
# of a second seen at a load of 20 on 2 cores); a listener that kept the GIL would cost seconds.
HELD_BOUND_S = 0.5
MAX_AGENT_CONNECTIONS = 16  # agent/server.py's MAX_CONNECTIONS: one thread and descriptor each


class Outcome(NamedTuple):
    returncode: int
    seconds: float
    stdout: str
    stderr: str


def ask_stall(job: Target) -> Tuple[float, float, int]:
    """(longest gap, longest gap less its wait for a CPU, beats) of the job's heartbeat since
    the last ask (tests/targets/heartbeat.py)."""
    assert job.process.stdin is not None
    before = sum(1 for line in job.stdout_lines if line.startswith("stall "))
    job.process.stdin.write(b"?\n")
    job.process.stdin.flush()
    deadline = time.monotonic() + 10
    while sum(1 for line in job.stdout_lines if line.startswith("stall ")) == before:
        assert time.monotonic() < deadline, f"the job did not answer: {job.output()}"
        time.sleep(0.01)
    _, longest, held, beats = [line for line in job.stdout_lines if line.startswith("stall ")][-1].split()
    return float(longest), float(held), int(beats)


class Flood:
    """The flooder (tcp_flooder.py), stopped (SIGTERM, else killed) and reaped on exit."""

    def __init__(self, port: int, sources: Tuple[str, ...]) -> None:
        self.report: Dict[str, Any] = {}
        self.process = subprocess.Popen(
            [VENV_PYTHON, FLOODER, "127.0.0.1", str(port), ",".join(sources), str(FLOOD_LIMIT_S)]
            + [str(FLOOD_MAX_CONNECTS), str(FLOOD_RATE)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_flooding(self) -> None:
        assert self.process.stdout is not None
        for expected in ("ready", "flooding"):
            line = self.process.stdout.readline().strip()
            if line != expected:
                self.stop()
                raise AssertionError(f"the flooder said {line!r}, not {expected!r}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            out, _ = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate(timeout=10)
        for line in out.splitlines():
            if line.startswith("{"):
                self.report = json.loads(line)

    def __enter__(self) -> Flood:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Peak:
    """The most threads and descriptors the job held, sampled every 10 ms from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.threads = self.descriptors = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            try:
                threads = len(os.listdir(f"/proc/{self.pid}/task"))
                descriptors = len(os.listdir(f"/proc/{self.pid}/fd"))
            except OSError:
                return
            self.threads = max(self.threads, threads)
            self.descriptors = max(self.descriptors, descriptors)

    def __enter__(self) -> Peak:
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join(5)


def threads_and_descriptors(pid: int) -> Tuple[int, int]:
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


def legit_eval(endpoint: str) -> Outcome:
    started = time.monotonic()
    try:
        result = subprocess.run(
            [PROBING, "-v", f"tcp://{endpoint}", "eval", "1+1"],
            capture_output=True,
            text=True,
            timeout=LEGIT_HARD_LIMIT_S,
            env=dict(os.environ, PROBING_TOKEN=TOKEN),
        )
    except subprocess.TimeoutExpired:
        return Outcome(-1, time.monotonic() - started, "", "no answer at all")
    return Outcome(result.returncode, time.monotonic() - started, result.stdout, result.stderr)


@pytest.fixture
def job() -> Iterator[Target]:
    env = {"PROBING_TOKEN": TOKEN, "PROBING_LISTEN": "127.0.0.1:0"}
    with Target("heartbeat.py", via="env", env=env) as started:
        yield started


@pytest.mark.parametrize(
    ("sources", "never_reset"),
    [(("127.0.0.2", "127.0.0.3"), True), (("127.0.0.1", "127.0.0.2"), False)],
    ids=["from-other-addresses", "from-the-clients-own-address-too"],
)
def test_every_client_with_the_token_gets_through_a_connection_flood(
    job: Target, sources: Tuple[str, ...], never_reset: bool
) -> None:
    """The clients connect from 127.0.0.1. From other addresses, per-source fairness keeps the
    flood off the clients' handshakes: none is ever reset. From their own address the flood
    cannot be told from them before they answer, and what gets them through is that an answer
    is read before its slot is given away, a slot lasts (256 handshakes, oldest first), and the
    client tries again when reset before the verdict."""
    endpoint = str(listener_of(job.pid)["endpoint"])
    port = int(endpoint.rsplit(":", 1)[1])
    base_threads, base_descriptors = threads_and_descriptors(job.pid)
    with ThreadPoolExecutor(CLIENTS_AT_ONCE) as pool:
        quiet = list(pool.map(legit_eval, [endpoint] * CLIENTS_AT_ONCE))
    assert all(outcome.returncode == 0 for outcome in quiet), quiet
    within = max(outcome.seconds for outcome in quiet) * SLOWER_UNDER_FLOOD + FLOOD_ALLOWANCE_S
    outcomes: List[Outcome] = []
    with Flood(port, sources) as flood, Peak(job.pid) as peak:
        flood.wait_flooding()
        before: Optional[Dict[str, Any]] = listener_of(job.pid).get("handshakes")
        ask_stall(job)
        started = time.monotonic()
        with ThreadPoolExecutor(CLIENTS_AT_ONCE) as pool:
            outcomes = list(pool.map(legit_eval, [endpoint] * LEGIT_CLIENTS))
        elapsed = time.monotonic() - started
        stall, stall_held, beats = ask_stall(job)
        after: Optional[Dict[str, Any]] = listener_of(job.pid).get("handshakes")
    assert job.alive(), job.output()

    good = [outcome for outcome in outcomes if outcome.returncode == 0 and outcome.stdout.strip() == "2"]
    reset = [outcome for outcome in outcomes if "reset before the verdict" in outcome.stderr]
    afresh = [outcome for outcome in outcomes if "connecting afresh" in outcome.stderr]
    seconds = sorted(round(outcome.seconds, 2) for outcome in outcomes)
    reached = after["accepted"] - before["accepted"] if after and before else 0
    figures = (
        f"{len(good)}/{LEGIT_CLIENTS} clients got through, in {seconds} s (without the flood: "
        f"{max(outcome.seconds for outcome in quiet):.2f} s at most; {len(reset)} reset before "
        f"the verdict and tried again, {len(afresh)} connected afresh); flood "
        f"{flood.report.get('rate')} connects/s from {sources}, "
        f"{reached / elapsed:.0f}/s accepted by the agent ({after}); the job's heartbeat held "
        f"{stall_held * 1000:.0f} ms at most ({stall * 1000:.0f} ms with its waits for a CPU; "
        f"{beats} beats); peak {peak.threads} threads (from {base_threads}), "
        f"{peak.descriptors} descriptors (from {base_descriptors})"
    )
    print(figures)
    failures = [outcome for outcome in outcomes if outcome not in good]
    assert not failures, f"{figures}\nfailed: {failures[:3]}"
    assert max(seconds) < within, figures
    if never_reset:
        assert not reset, figures
    # The flood was one: thousands of connections reached the agent meanwhile.
    assert reached > 2000, figures
    assert stall_held < HELD_BOUND_S, figures
    assert peak.descriptors <= base_descriptors + handshakes.capacity() + MAX_AGENT_CONNECTIONS + 4, figures
    assert peak.threads <= base_threads + 2 * MAX_AGENT_CONNECTIONS, figures
