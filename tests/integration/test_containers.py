"""Jobs in their own mount and PID namespaces, as in a container, made with unshare(1).

Their /tmp is not ours (the socket is reached through /proc/PID/root), they may know
themselves by another PID, and they may not see probing's install at all (it is copied in).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Iterator, List

import pytest

from probing.errors import ExitCode

from support import TARGETS, VENV_PYTHON, find_interpreter, probing

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) to make namespaces",
)
PYTHON = find_interpreter("~/.pyenv/versions/3.12*/bin/python3.12") or VENV_PYTHON
# The jobs get a fresh /tmp: their script must live elsewhere (the checkout may be in /tmp).
SCRIPTS = "/var/tmp"


class NamespacedJob:
    def __init__(self, setup: List[str], pid_namespace: bool) -> None:
        if PYTHON.startswith("/tmp/"):
            pytest.skip(f"the interpreter {PYTHON} is under /tmp, which the job's namespace replaces")
        self.script = tempfile.NamedTemporaryFile(suffix=".py", dir=SCRIPTS)
        self.script.write((TARGETS / "sleeper.py").read_bytes())
        self.script.flush()
        os.chmod(self.script.name, 0o644)
        flags = ["--mount", "--propagation", "private", "--fork"] + (
            ["--pid", "--mount-proc"] if pid_namespace else []
        )
        inner = " && ".join([*setup, f"exec {PYTHON} {self.script.name}"])
        self.process = subprocess.Popen(
            ["unshare", *flags, "sh", "-c", inner], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.ready = self.process.stdout.readline()
        assert self.ready.startswith("ready"), self.ready
        # unshare --fork: the job is unshare's child.
        self.pid = int(
            subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True).stdout
        )

    def stop(self) -> None:
        self.process.kill()
        subprocess.run(["kill", "-9", str(self.pid)], capture_output=True)
        self.process.wait()
        self.script.close()
        self.script.close()


@pytest.fixture
def make_job() -> Iterator[object]:
    jobs: List[NamespacedJob] = []

    def make(setup: List[str], pid_namespace: bool = False) -> NamespacedJob:
        jobs.append(NamespacedJob(setup, pid_namespace))
        return jobs[-1]

    yield make
    for job in jobs:
        job.stop()


def test_a_job_with_its_own_tmp(make_job: object) -> None:
    job = make_job(["mount -t tmpfs tmpfs /tmp"])  # type: ignore[operator]
    result = probing(str(job.pid), "backtrace")
    assert result.returncode == 0, result.stderr
    directory = os.environ["PROBING_SOCKET_DIR"]  # the job inherited it: a path in its own /tmp
    assert os.path.exists(f"/proc/{job.pid}/root{directory}/{job.pid}.sock")
    assert not os.path.exists(f"{directory}/{job.pid}.sock")


def test_a_job_in_its_own_pid_namespace(make_job: object) -> None:
    job = make_job(["mount -t tmpfs tmpfs /tmp"], pid_namespace=True)  # type: ignore[operator]
    assert job.ready.split()[1] == "1"  # it is PID 1 where it lives
    result = probing(str(job.pid), "backtrace")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Process {job.pid} (PID 1 in its namespace) (Python 3.")
    assert probing(str(job.pid), "query", "SELECT count(*) FROM python.threads").returncode == 0


def test_a_job_that_cannot_see_probings_install(make_job: object) -> None:
    hidden = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__import__("probing").__file__)))
    )
    # Hide the install first: it may itself be under /tmp, which is replaced next.
    job = make_job([f"mount -t tmpfs tmpfs {hidden}", "mount -t tmpfs tmpfs /tmp"])  # type: ignore[operator]
    result = probing("-v", str(job.pid), "backtrace")
    assert result.returncode == 0, result.stderr
    assert "in another mount namespace: probing copied to" in result.stderr
    where = probing(
        str(job.pid), "eval", "import probing, sys; probing.__file__, [p for p in sys.path if 'probing' in p]"
    )
    assert where.stdout.startswith("('/tmp/probing-") and where.stdout.endswith(", [])\n"), where.stderr
    assert probing(str(job.pid), "--no-attach", "detach").returncode == 0
    assert probing(str(job.pid), "--no-attach", "eval", "1").returncode == ExitCode.NO_AGENT
