"""The first command on a multiprocessing.Pool parent (issue 25, item 4).

Measured on the landed main: the first `probing PID backtrace` on a fresh Pool parent fell back
to py-spy in 3 of 36 attaches and blamed a thread for holding the GIL, once a thread that does
not exist ("PID 13657: thread '0' holds the GIL"). The look from outside that decides the
fallback (0.3 s into the attach, or into the agent's silence) lands while the agent loads and
starts its threads, and py-spy's owns_gil is wrong then: with the GIL free it matches thread
id 0, which a starting thread's state has (3.12+); up to 3.10 it shows a thread under no OS id
or under an exited thread's; and the agent's own threads, busy loading it, were taken for the
job's when threading had named one "Dummy-N", or when the loader had ended by the time the
verdict was written (outside/gil.py, outside/pyspy.py checked_gil). An idle Pool parent has no
thread that keeps the GIL, so no look may name one, and its agent can always answer.

Each trial takes a fresh Pool parent; while its first command waits for the agent it has just
injected, this test takes the same look as the CLI (Target.gil_holder: py-spy, then /proc) as
often as it can, which finds a wrong culprit far more often than the one or two looks of the
command itself. Looking starts once the injector has let go of the process: two tracers cannot
hold one thread.
"""

from __future__ import annotations

import os
import subprocess
import threading
from typing import Dict, Iterator, List

import pytest

from probing.engine.target import Target as Inspected
from probing.outside.gil import keeps_the_gil

from support import BIN, PROBING, Target, interpreter_params

TRIALS = 3  # per interpreter: ~20 fresh Pool parents in all, ~20 s on the 2-core test machine
PYTHON_CLI = str(BIN / "probing-python")
# The command's own budget: on a loaded machine the agent may take seconds to load, and this
# test is about what the early look concludes, not about a slow load.
COMMAND_TIMEOUT = "30"


@pytest.fixture(params=interpreter_params())
def python(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


class Looks:
    """Looks from outside at `pid` in a thread, as the CLI's early look takes them, until
    stopped; `named` holds what any of them said holds the GIL, with the process's threads."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.count = 0
        self.started = False
        self.named: List[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        if not self.started:
            self.started = True
            self._thread.start()

    def _run(self) -> None:
        inspected = Inspected(str(self.pid))
        while True:  # one look at least, however soon the command ends
            holder = inspected.gil_holder()  # None too when py-spy could not read the process
            self.count += 1
            if holder is not None:
                tasks = sorted(os.listdir(f"/proc/{self.pid}/task"))
                self.named.append(f"{holder} (threads of PID {self.pid}: {', '.join(tasks)})")
            if self._stop.is_set():
                return

    def stop(self) -> None:
        self._stop.set()
        if self.started:
            self._thread.join(30)


def environment() -> Dict[str, str]:
    return {name: value for name, value in os.environ.items() if name != "PROBING"}


def first_command(pid: int, command: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """`command -v PID backtrace`, the attach included, looked at from outside meanwhile."""
    process = subprocess.Popen(
        [command, "-v", str(pid), "backtrace", "--timeout", COMMAND_TIMEOUT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(),
    )
    looks = Looks(pid)
    stderr = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            stderr.append(line)
            if "waiting for the agent" in line:
                looks.start()
        assert process.stdout is not None
        stdout = process.stdout.read()
        process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        looks.stop()
    said = "".join(stderr)
    assert process.returncode == 0, said
    assert looks.started, f"the command did not say it was waiting for the agent it injected: {said}"
    assert looks.named == [], f"a look named a GIL holder in an idle Pool parent: {looks.named}"
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, said)


def test_no_command_on_a_fresh_pool_parent_names_a_gil_holder_and_the_agent_answers(python: str) -> None:
    for trial in range(TRIALS):
        mode = "apply" if trial == 1 else "map"
        # The first command through each front end in turn (the native one hands an attach to
        # the Python CLI), the second through the other: the native front end then answers.
        fronts = (PROBING, PYTHON_CLI) if trial % 2 == 0 else (PYTHON_CLI, PROBING)
        with Target("pool_parent.py", python=python, via="plain", args=[mode]) as job:
            first = first_command(job.pid, fronts[0])
            assert "holds the GIL" not in first.stderr + first.stdout
            assert "answered from outside" not in first.stderr, first.stderr
            assert "in _handle_results" in first.stdout  # the pool's threads, as the agent sees them
            second = subprocess.run(
                [fronts[1], str(job.pid), "backtrace"],
                capture_output=True,
                text=True,
                timeout=60,
                env=environment(),
            )
            assert second.returncode == 0, second.stderr
            assert second.stderr == "" and "holds the GIL" not in second.stdout
            assert job.alive()


def test_the_looks_after_a_dump_tell_a_thread_that_keeps_the_gil_from_one_that_let_it_go() -> None:
    """What the looks at /proc after py-spy's dump conclude of the thread it flags (outside/gil.py):
    a thread asleep while another runs has let the GIL go, if it ever had it; a thread that runs
    and uses the CPU keeps it; a thread asleep in a C call holding it while nothing else can run
    (gil_holder.py) keeps it."""
    with Target("slow_and_fast.py", via="plain") as job:
        spinner = next(int(task) for task in os.listdir(f"/proc/{job.pid}/task") if int(task) != job.pid)
        assert not keeps_the_gil(job.pid, job.pid)  # the main thread, reading stdin
        assert keeps_the_gil(job.pid, spinner)
    with Target("gil_holder.py", via="plain") as job:
        holder = next(int(task) for task in os.listdir(f"/proc/{job.pid}/task") if int(task) != job.pid)
        assert keeps_the_gil(job.pid, holder)
