"""A job names the files its frames come from (a code object's co_filename is whatever the job
compiled it with), and root inspects other users' jobs: root's CLI must never show a line of a
file the job's own user could not read. nobody's job here runs code "from" a root-only file and
code from a file anyone may read; every command that shows source lines (the native front end's
backtrace, the Python CLI's, hang, report, and a record nobody's agent wrote) shows the second
file's line and never the first's."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from support import BIN, TARGETS, Target, listening_endpoint, probing, wait_until

SECRET = "SECRET-ROOT-ONLY-LINE"
VISIBLE = "VISIBLE-TO-ANYONE-LINE"


@pytest.fixture
def nobodys_job() -> Iterator[subprocess.Popen]:  # type: ignore[type-arg]
    if os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs root (to read another user's job) and /usr/bin/python3 (for nobody's job)")
    nobody = pwd.getpwnam("nobody")
    shared = Path(tempfile.mkdtemp(prefix="probing-sources-"))
    shared.chmod(0o755)
    secret = shared / "secret.py"  # root's own, readable by root alone, in a directory anyone may enter
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    visible = shared / "visible.py"
    visible.write_text(VISIBLE + "\n")
    visible.chmod(0o644)
    records = Path(tempfile.mkdtemp(prefix="probing-nobody-records-"))
    os.chown(records, nobody.pw_uid, nobody.pw_gid)
    job = subprocess.Popen(
        ["/usr/bin/python3", "-c", (TARGETS / "named_files.py").read_text(), str(secret), str(visible)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/",
        user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "PROBING_RECORD_DIR": str(records)},
    )  # fmt: skip
    try:
        assert job.stdout is not None and job.stdout.readline() == b"ready\n"
        job.records = records  # type: ignore[attr-defined]
        yield job
    finally:
        job.kill()
        job.wait(10)
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(records, ignore_errors=True)


def _shows_only_what_nobody_may_read(text: str) -> None:
    assert SECRET not in text, text
    assert VISIBLE in text, text


def test_root_shows_no_line_of_a_file_the_jobs_user_could_not_read(
    nobodys_job: subprocess.Popen,
    tmp_path: Path,  # type: ignore[type-arg]
) -> None:
    pid = str(nobodys_job.pid)
    native = probing(pid, "backtrace")  # attaches; the native front end answers
    assert native.returncode == 0, native.stderr
    _shows_only_what_nobody_may_read(native.stdout)

    python = subprocess.run(
        [str(BIN / "probing-python"), pid, "backtrace"], capture_output=True, text=True, timeout=60
    )
    assert python.returncode == 0, python.stderr
    assert python.stdout == native.stdout  # the same rule, written twice

    hang = probing(pid, "hang", "--duration", "1", "--format", "json")
    assert SECRET not in hang.stdout + hang.stderr

    page = tmp_path / "report.html"
    report = probing(pid, "report", "-o", str(page), "--hang-duration", "0.5")
    assert report.returncode == 0, report.stderr
    assert SECRET not in page.read_text()

    written = probing(pid, "record", "--format", "json")
    assert written.returncode == 0, written.stderr
    records = nobodys_job.records  # type: ignore[attr-defined]
    assert wait_until(lambda: any(records.glob("*.probing")))
    record = next(records.glob("*.probing"))
    assert record.stat().st_uid != 0  # nobody's, as its agent wrote it
    stacks = probing(str(record), "backtrace")
    assert stacks.returncode == 0, stacks.stderr
    _shows_only_what_nobody_may_read(stacks.stdout)


def test_an_endpoints_files_are_read_as_nobodys(tmp_path: Path) -> None:
    """An agent reached over TCP runs on its own machine: the PID it gives is that machine's,
    and here it may be any process's, root's too. A job that names this machine's root-only
    file (or claims PID 1) must not have root's CLI print it: an endpoint's files are read as
    nobody's, the world-readable ones only. Here the "other machine" is this one and the job
    root's, so reading as the job's PID would show the secret."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a CLI that is not root reads only what the kernel lets it")
    shared = Path(tempfile.mkdtemp(prefix="probing-sources-"))
    try:
        shared.chmod(0o755)
        secret = shared / "secret.py"
        secret.write_text(SECRET + "\n")
        secret.chmod(0o600)
        visible = shared / "visible.py"
        visible.write_text(VISIBLE + "\n")
        visible.chmod(0o644)
        token = {"PROBING_TOKEN": "a" * 32}
        env = dict(token, PROBING_LISTEN="127.0.0.1:0")
        with Target("named_files.py", via="env", args=[str(secret), str(visible)], env=env) as job:
            url = f"tcp://{listening_endpoint(job)}"
            stacks = probing(url, "backtrace", env=token)
            assert stacks.returncode == 0, stacks.stderr
            _shows_only_what_nobody_may_read(stacks.stdout)
            growth = probing(url, "memory", "--growth", "0.5", env=token)
            assert SECRET not in growth.stdout + growth.stderr
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_symlink_the_job_planted_leads_nowhere_it_could_not_go() -> None:
    """readable_as follows a job's symlinks as the kernel would for the job's user."""
    from probing.engine.sources import Reader, readable_as

    nobody = pwd.getpwnam("nobody")
    reader = Reader(nobody.pw_uid, frozenset([nobody.pw_gid]))
    base = Path(tempfile.mkdtemp(prefix="probing-readable-"))
    try:
        base.chmod(0o755)
        closed = base / "closed"
        closed.mkdir(mode=0o700)
        (closed / "inside.py").write_text("x = 1\n")
        (closed / "inside.py").chmod(0o644)  # readable, but behind a directory nobody cannot search
        opened = base / "open"
        opened.mkdir(mode=0o755)
        (opened / "sub").mkdir(mode=0o755)
        (opened / "link").symlink_to(closed / "inside.py")
        (opened / "mine.py").write_text("y = 2\n")
        (opened / "mine.py").chmod(0o644)
        assert readable_as(reader, str(opened / "link")) is None
        assert readable_as(reader, str(opened / ".." / "closed" / "inside.py")) is None
        found = readable_as(reader, str(opened / "sub" / ".." / "mine.py"))
        assert found is not None and found[0] == str(opened / "mine.py")
        assert readable_as(reader, "relative.py") is None
        # Under a root prefix, an absolute symlink stays inside it.
        (opened / "escape").symlink_to("/mine.py")
        inside = readable_as(reader, "/escape", str(opened))
        assert inside is not None and inside[0] == str(opened / "mine.py")
    finally:
        shutil.rmtree(base, ignore_errors=True)
