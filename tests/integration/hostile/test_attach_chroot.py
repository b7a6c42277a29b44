"""A job in a chroot attaches like any other (issue 25, item 11).

The chroot is made of bind mounts (/usr, the interpreter's own prefix) and a /proc inside a
private mount namespace from `unshare --mount`, so nothing of it reaches the host's mounts and
all of it goes when the job does. Two ways of standing outside it:

- in the job's own mount namespace (`nsenter --mount`): a plain chroot, where /proc/PID/maps
  names the job's libc by a path from our root (the chroot's directory first), and the job's
  /tmp is not ours although the namespace is;
- on the host: a chroot inside another mount namespace, where maps names it from that
  namespace's root, which is no path of ours either.

Before the fix both failed with "no dlopen in <chroot>/usr/lib/.../libc.so.6" (the injector
opened /proc/PID/root + that path) and exit 7.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from probing import __version__

from support import PROBING, TARGETS, VENV_PYTHON, find_interpreter

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("unshare", "chroot", "nsenter")),
    reason="needs root, unshare(1), chroot(8) and nsenter(1) to make a chroot",
)
# An interpreter with a prefix of its own (bind-mounted as it is) where there is one.
PYTHON = os.path.realpath(find_interpreter("~/.pyenv/versions/3.12*/bin/python3.12") or VENV_PYTHON)


def _prefix(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _mounts(root: Path, prefix: str) -> List[str]:
    """Shell commands that fill `root` as a chroot: /usr and the interpreter bound in, /lib and
    /lib64 as the host has them (symlinks into usr/ on a merged-/usr system), /proc, a /tmp."""
    commands = [f"mkdir -p {root}/usr {root}/proc {root}/tmp", f"chmod 1777 {root}/tmp",
                f"mount --bind /usr {root}/usr", f"mount -t proc proc {root}/proc"]  # fmt: skip
    for directory in ("/lib", "/lib64", "/bin"):
        if os.path.islink(directory):
            commands.append(f"ln -s {os.readlink(directory)} {root}{directory}")
        elif os.path.isdir(directory):
            commands += [f"mkdir -p {root}{directory}", f"mount --bind {directory} {root}{directory}"]
    if not prefix.startswith("/usr/"):
        commands += [f"mkdir -p {root}{prefix}", f"mount --bind {prefix} {root}{prefix}"]
    return commands


class ChrootedJob:
    """tests/targets/sleeper.py run by `chroot ROOT PYTHON /sleeper.py` in a private mount
    namespace; `pid` is the job's PID (the namespace's only process once `unshare` forked)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        shutil.copy(TARGETS / "sleeper.py", root / "sleeper.py")
        setup = " && ".join(_mounts(root, _prefix(PYTHON)))
        environment = {key: value for key, value in os.environ.items() if not key.startswith("PROBING")}
        self.process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c",
             f"{setup} && exec chroot {root} {PYTHON} /sleeper.py"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
        )  # fmt: skip
        assert self.process.stdout is not None and self.process.stderr is not None
        ready = self.process.stdout.readline()
        if not ready.startswith("ready"):
            self.stop()
            raise RuntimeError(f"the chrooted job never said ready: {ready!r} {self.process.stderr.read()!r}")
        self.pid = int(ready.split()[1])  # the job shares our PID namespace

    def stop(self) -> None:
        try:
            os.kill(self.pid, 9)
        except (AttributeError, ProcessLookupError):
            pass
        self.process.kill()
        self.process.wait(10)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[ChrootedJob]:
    chrooted = ChrootedJob(tmp_path / "root")
    try:
        yield chrooted
    finally:
        chrooted.stop()


def _probing(job: ChrootedJob, inside_its_namespace: bool, *args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """`probing ARGS` from the host, or from the job's own mount namespace (outside its chroot)."""
    prefix = ["nsenter", f"--mount=/proc/{job.pid}/ns/mnt", "--"] if inside_its_namespace else []
    environment: Dict[str, str] = {key: value for key, value in os.environ.items() if key != "PROBING"}
    return subprocess.run(
        [*prefix, PROBING, *args], capture_output=True, text=True, timeout=60, env=environment
    )


def _copied_into_the_chroot(job: ChrootedJob) -> Optional[str]:
    path = f"/tmp/probing-{__version__}-{os.geteuid()}/probing/__init__.py"
    return path if (job.root / path.lstrip("/")).exists() else None


@pytest.mark.parametrize("inside_its_namespace", [True, False], ids=["same-mount-namespace", "from-the-host"])
def test_a_chrooted_job_attaches_and_answers_backtrace_eval_and_query(
    job: ChrootedJob, inside_its_namespace: bool
) -> None:
    assert os.readlink(f"/proc/{job.pid}/root") == str(job.root)

    backtrace = _probing(job, inside_its_namespace, "-v", str(job.pid), "backtrace")
    assert backtrace.returncode == 0, backtrace.stderr
    assert f"Process {job.pid} (Python " in backtrace.stdout
    assert 'File "/sleeper.py", line' in backtrace.stdout and "in main_loop" in backtrace.stdout
    assert f"is in a chroot ({job.root})" in backtrace.stderr, backtrace.stderr
    # The agent's socket is a file of the chroot's /tmp, found from outside through /proc/PID/root.
    assert f"agent listening at /proc/{job.pid}/root/tmp/probing-0/{job.pid}.sock" in backtrace.stderr
    assert not os.path.exists(f"/tmp/probing-0/{job.pid}.sock")

    # The agent came from the copy of this install inside the chroot, loaded by file path: the
    # job's sys.path is its own (no CLI site-packages, no probing).
    copied = _copied_into_the_chroot(job)
    assert copied is not None
    where = _probing(
        job, inside_its_namespace, str(job.pid), "eval",
        "import sys; probing_module = sys.modules['probing']; "
        "(probing_module.__file__, [p for p in sys.path if 'probing' in p or '.venv' in p])",
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert where.stdout == f"({copied!r}, [])\n"

    query = _probing(
        job, inside_its_namespace, str(job.pid), "query",
        "SELECT func FROM python.backtrace WHERE depth = 0 AND is_main", "--format", "csv",
    )  # fmt: skip
    assert query.returncode == 0, query.stderr
    assert query.stdout.split() == ["func", "main_loop"]


def test_a_chrooted_job_reached_with_fewer_capabilities_is_attached_through_its_root(
    job: ChrootedJob,
) -> None:
    """Without CAP_SYS_ADMIN (root in a container, `--cap-add=SYS_PTRACE` alone), the mapped
    libc cannot be opened through /proc/PID/map_files: the injector finds it under the job's
    root by its device and inode instead, and must not guess."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv(1) not found")
    drop = ["setpriv", "--bounding-set", "-sys_admin,-checkpoint_restore", "--"]
    environment = {key: value for key, value in os.environ.items() if key != "PROBING"}
    result = subprocess.run(
        [*drop, PROBING, "-v", str(job.pid), "backtrace"],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert result.returncode == 0, result.stderr
    assert "in main_loop" in result.stdout
    assert f"(read as /proc/{job.pid}/root/usr/lib/" in result.stderr, shlex.quote(result.stderr)
