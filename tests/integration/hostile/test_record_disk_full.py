"""A full record directory: the job starts, runs and ends as without probing, leaves no empty
`.fatal` file behind, and `probing PID record` says the disk is full with its exit code (18), in
JSON too. The full disk is real: a 64 KB tmpfs, filled, mounted in a mount namespace of the job's
own (`unshare -m`, root only), so nothing outside it sees or fills anything.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator, List

import pytest

from probing.errors import ExitCode

from support import VENV_PYTHON, Target, probing


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _can_mount(), reason="needs root and unshare -m (a private tmpfs)")

# Mounts a full tmpfs on $0 (records/ made 0700 before it fills), then becomes "$@", in that
# namespace and with the same PID.
FULL_DISK = (
    'mount -t tmpfs -o size=64k probing-full "$0" && mkdir -m 700 "$0/records" && '
    '{ head -c 1048576 /dev/zero > "$0/filler" 2>/dev/null; true; } && exec "$@"'
)


def full_disk_command(mount: Path, *command: str) -> List[str]:
    return ["unshare", "-m", "sh", "-c", FULL_DISK, str(mount), *command]


def test_a_job_on_a_full_record_disk_leaves_no_fatal_file(tmp_path: Path) -> None:
    """The header of the `.fatal` file does not fit: the file is removed and its descriptor
    closed, and the job's output and exit status are its own."""
    mount = tmp_path / "full"
    mount.mkdir()
    job = (
        "import os; print('hi'); "
        "print([os.readlink('/proc/self/fd/' + fd) for fd in os.listdir('/proc/self/fd') "
        "if os.path.exists('/proc/self/fd/' + fd) and '/full/' in os.readlink('/proc/self/fd/' + fd)])"
    )
    script = (
        f'PROBING=1 PROBING_RECORD_DIR="$0/records" {VENV_PYTHON} -c "$1"; echo "exit $?"; ls -A "$0/records"'
    )
    result = subprocess.run(
        full_disk_command(mount, "sh", "-c", script, str(mount), job),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hi\n[]\nexit 0\n"  # no descriptor into it, no file in it
    assert result.stderr == ""


@pytest.fixture
def job_on_a_full_disk(tmp_path: Path) -> Iterator[Target]:
    mount = tmp_path / "full"
    mount.mkdir()
    # Target runs PYTHON SCRIPT: this "python" mounts the full disk first, then becomes the job.
    python = tmp_path / "python-on-a-full-disk"
    command = " ".join(f"'{part}'" for part in full_disk_command(mount, VENV_PYTHON))
    python.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    python.chmod(0o755)
    with Target(
        "sleeper.py", python=str(python), via="env", env={"PROBING_RECORD_DIR": f"{mount}/records"}
    ) as job:
        yield job


def test_record_on_a_full_disk_says_so_with_its_exit_code(job_on_a_full_disk: Target) -> None:
    pid = str(job_on_a_full_disk.pid)
    result = probing(pid, "record")
    assert result.returncode == 18, result.stderr
    assert f"probing: error: PID {pid}: no record: cannot write in " in result.stderr
    assert "No space left on device" in result.stderr
    assert "bug in probing" not in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""
    as_json = probing(pid, "record", "--format", "json")
    assert as_json.returncode == 18, as_json.stderr
    answer = json.loads(as_json.stdout)
    assert answer["pid"] == int(pid) and answer["path"] is None and answer["exit_code"] == 18
    assert "No space left on device" in answer["error"]
    assert job_on_a_full_disk.alive()
    assert ExitCode.RECORD_NOT_WRITTEN == 18  # the documented code


def test_the_job_on_a_full_disk_still_answers(job_on_a_full_disk: Target) -> None:
    result = probing(str(job_on_a_full_disk.pid), "backtrace")
    assert result.returncode == 0, result.stderr
    assert "main_loop" in result.stdout
