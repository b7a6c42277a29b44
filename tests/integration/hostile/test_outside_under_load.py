"""Reading a job from outside (py-spy) on a loaded machine: the user's --timeout reaches the
read's deadline, and a read that passes it says which deadline passed and what to raise.

The load is real: CPU hogs, one or more per core, each ending by itself within two minutes, and
probing run at low priority (nice) beside them, as a debugger run next to a job that fills every
core is. Under one hog per core and nice 19, `py-spy dump --native` of a process with torch
imported (py-spy reads the symbols of every library, libtorch's among them) took 3-16 s on the
shared 2-core machine where this was written, 0.1-0.5 s on it idle: how much the machine's other
users leave varies that much. So the pair of commands is run again, up to three times, where the
load did not make the case under test: py-spy done within the default 3 s (the load is doubled),
or not within 20 s, which the second command then says (the load is halved).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import List

import pytest

from support import PROBING, Target

pytest.importorskip("torch")

# It makes the load itself, CPU hogs on every core calibrated to what py-spy takes under them:
# beside other tests the load is neither its own nor measured, and it would starve them.
pytestmark = pytest.mark.serial

HOG_SECONDS = 120
MOST_HOGS_PER_CORE, GENTLEST_NICE = 4, 13


class Load:
    """Hogs (`per_core` per core) and the priority (`nice`) probing runs at beside them."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.cores = len(os.sched_getaffinity(0))
        self.hogs: List[Target] = []
        self.nice = 19
        self.heavier()

    def heavier(self) -> None:
        """Twice the hogs: py-spy's share of a core about halves."""
        for _ in range(max(self.cores, len(self.hogs))):
            if len(self.hogs) < MOST_HOGS_PER_CORE * self.cores:
                hog = Target("cpu_hog.py", via="plain", args=[str(HOG_SECONDS)])
                self.hogs.append(self.stack.enter_context(hog))

    def lighter(self) -> None:
        """Three steps of nice less: each step weighs ~1.25 times the last, so about twice."""
        self.nice = max(GENTLEST_NICE, self.nice - 3)

    def run(self, *command: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
        environment = {key: value for key, value in os.environ.items() if key != "PROBING"}
        return subprocess.run(
            ["nice", "-n", str(self.nice), *command],
            capture_output=True,
            text=True,
            timeout=150,
            env=environment,
        )

    def __str__(self) -> str:
        return f"{len(self.hogs)} hogs on {self.cores} cores, probing at nice {self.nice}"


def test_native_backtrace_under_load_gets_the_time_timeout_gives_and_says_so_when_out_of_it() -> None:
    tries: List[str] = []
    with Target("torch_job.py", via="plain", args=["--gate"]) as job, contextlib.ExitStack() as stack:
        load = Load(stack)
        for _ in range(3):
            default = load.run(PROBING, str(job.pid), "backtrace", "--native")
            given = load.run(PROBING, str(job.pid), "backtrace", "--native", "--timeout", "20")
            tries.append(f"{load}: default exit {default.returncode}, --timeout 20 exit {given.returncode}")
            if default.returncode == 0:
                load.heavier()  # py-spy was done within 3 s: not loaded enough
            elif "within 20 s" in given.stderr:
                load.lighter()  # nor within 20 s: loaded too much
            else:
                break
    assert given.returncode == 0, (tries, given.stderr)
    assert given.stdout.startswith(f"Process {job.pid} "), given.stdout
    assert "[native]" in given.stdout and "torch_job.py" in given.stdout, given.stdout
    assert default.returncode == 1, (tries, default)
    assert default.stderr.splitlines() == [
        f"probing: error: py-spy did not read the stacks of PID {job.pid} within 3 s, the time a read "
        "from outside gets (--timeout, at least 3 s)",
        "  hint: raise --timeout, e.g. --timeout 12: py-spy is slower on a loaded machine, and "
        "--native slower still",
    ]
