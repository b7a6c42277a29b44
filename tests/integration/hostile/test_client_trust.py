"""The CLI's side of trust: the job, and whatever answers on its socket, are untrusted input.

A hostile job (tests/targets/hostile_agent.py) answers with crafted frames; another user
plants a symlink to root's socket. The CLI must refuse, with a clear error and a documented
exit code, quickly and with bounded memory, and never run root's command in the wrong job.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, NamedTuple

import pytest

from probing.errors import ExitCode

from support import PROBING, Target

# The CLI with everything it imports for a query (DuckDB, numpy) stays well under this; a
# reply that made it reserve an announced length would not.
MAX_CLI_RSS_MB = 200


class CliRun(NamedTuple):
    returncode: int
    stdout: str
    stderr: str
    max_rss_mb: float
    seconds: float


# The CLI is started by a small reaper process: a child's peak RSS on Linux includes the memory
# of the process it was forked from (exec records the old image's high-water mark), and the
# pytest process that forks it may have grown to hundreds of MB by now.
_REAPER = (
    "import os, sys\n"
    "pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "with open(os.environ['PROBING_TEST_RUSAGE'], 'w') as out:\n"
    "    out.write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def run_cli_measured(*args: str, timeout: float = 30.0) -> CliRun:
    """`probing ARGS` reaped with os.wait4 by a small reaper, so that its peak RSS is its own."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        usage = tempfile.NamedTemporaryFile()
        environment = dict(os.environ, PROBING_TEST_RUSAGE=usage.name)
        process = subprocess.Popen(
            [sys.executable, "-S", "-c", _REAPER, PROBING, *args], stdout=out, stderr=err,
            stdin=subprocess.DEVNULL, start_new_session=True, env=environment,
        )  # fmt: skip
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise AssertionError(f"probing {' '.join(args)} ran past {timeout} s") from None
        with usage:
            max_rss_kb = int(usage.read() or 0)
        out.seek(0)
        err.seek(0)
        return CliRun(
            process.returncode,
            out.read().decode("utf-8", "replace"),
            err.read().decode("utf-8", "replace"),
            max_rss_kb / 1024.0,
            time.monotonic() - started,
        )


def hostile(mode: str, *extra: str, env: dict = None) -> Target:  # type: ignore[assignment]
    return Target("hostile_agent.py", via="plain", args=[mode, *extra], env=env)


def assert_clear_error(run: CliRun, code: int, words: str) -> None:
    assert run.returncode == code, run
    assert run.stderr.startswith("probing: error:"), run.stderr
    assert words in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert run.max_rss_mb < MAX_CLI_RSS_MB, run
    assert run.seconds < 20, run


# (mode of the hostile agent, command, exit code, words of the message)
BAD_REPLIES = [
    ("huge-announce", ["eval", "1"], ExitCode.BAD_REPLY, "announced a reply of"),
    ("huge-trickle", ["eval", "--timeout", "0.5", "1"], ExitCode.AGENT_TIMEOUT, "did not answer"),
    ("huge-close", ["eval", "1"], ExitCode.ERROR, "closed the connection"),
    ("bad-magic", ["eval", "1"], ExitCode.BAD_REPLY, "does not speak probing's protocol"),
    ("garbage-json", ["eval", "1"], ExitCode.BAD_REPLY, "not valid JSON"),
    ("deep-json", ["eval", "1"], ExitCode.BAD_REPLY, "not valid JSON"),
    ("not-an-object", ["eval", "1"], ExitCode.BAD_REPLY, "not a JSON object"),
    ("result-not-object", ["eval", "1"], ExitCode.BAD_REPLY, "is a int, not an object"),
    ("wrong-types", ["eval", "1"], ExitCode.BAD_REPLY, "'stdout' of type int"),
    ("wrong-id", ["eval", "1"], ExitCode.BAD_REPLY, "answers request"),
    ("error-reply-types", ["eval", "1"], ExitCode.ERROR, "boom"),
    ("result-missing-keys", ["backtrace"], ExitCode.BAD_REPLY, "'table'"),
    ("table-not-object", ["backtrace"], ExitCode.BAD_REPLY, "'table'"),
    ("table-bad-offsets", ["backtrace"], ExitCode.BAD_REPLY, "outside the payload"),
    ("table-rows-mismatch", ["backtrace"], ExitCode.BAD_REPLY, "for 1000 rows"),
    ("table-bad-type", ["backtrace"], ExitCode.BAD_REPLY, "has type"),
    ("table-dict-count", ["backtrace"], ExitCode.BAD_REPLY, "outside the payload"),
    ("table-dict-codes", ["backtrace"], ExitCode.BAD_REPLY, "codes outside its dictionary"),
    ("table-bad-type", ["query", "SELECT pid FROM python.backtrace"], ExitCode.BAD_REPLY, "has type"),
    # An agent that goes away mid-query is unreachable (1), not silent (7).
    ("huge-close", ["query", "SELECT * FROM process.memory"], ExitCode.ERROR, "closed the connection"),
]


@pytest.mark.parametrize(
    "mode, command, code, words", BAD_REPLIES, ids=[f"{m}-{c[0]}" for m, c, _, _ in BAD_REPLIES]
)
def test_a_malformed_reply_is_a_clear_error_in_bounded_time_and_memory(
    mode: str, command: List[str], code: int, words: str
) -> None:
    with hostile(mode) as job:
        run = run_cli_measured(str(job.pid), "--no-attach", *command)
    assert_clear_error(run, code, words)


@pytest.fixture
def socket_dir_of_its_own() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="probing-trust-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_socket_answered_by_another_process_than_the_target_is_refused(socket_dir_of_its_own: Path) -> None:
    env = {"PROBING_SOCKET_DIR": str(socket_dir_of_its_own)}
    with Target("sleeper.py", via="plain", env=env) as job:
        with hostile("obliging", "--as-pid", str(job.pid), env=env) as impostor:
            run = run_cli_measured(str(job.pid), "--no-attach", "eval", "1")
            by_path = run_cli_measured(str(socket_dir_of_its_own / f"{job.pid}.sock"), "eval", "1")
    assert_clear_error(run, ExitCode.PERMISSION_DENIED, f"is PID {impostor.pid}, not PID {job.pid}")
    assert "hijacked" not in run.stdout
    # Given as a path, the socket's name still says which process must answer on it.
    assert_clear_error(by_path, ExitCode.PERMISSION_DENIED, f"not PID {job.pid} that the socket's name says")


def test_a_socket_path_whose_name_is_not_a_pid_is_answered_by_its_owners_process(
    socket_dir_of_its_own: Path,
) -> None:
    """The documented rule for a socket given as the target: its owner must be the peer's
    user; the PID is checked only when the name is `<pid>.sock`."""
    path = socket_dir_of_its_own / "agent.sock"
    with hostile("obliging", "--path", str(path)):
        run = run_cli_measured(str(path), "eval", "1")
    assert run.returncode == 0, run
    assert run.stdout == "hijacked\n"


def test_a_socket_directory_other_users_may_enter_is_refused(socket_dir_of_its_own: Path) -> None:
    env = {"PROBING_SOCKET_DIR": str(socket_dir_of_its_own)}
    with hostile("obliging", env=env) as job:
        socket_dir_of_its_own.chmod(0o755)
        run = run_cli_measured(str(job.pid), "--no-attach", "eval", "1")
    assert_clear_error(run, ExitCode.PERMISSION_DENIED, "has mode 0755, not 0700")
    assert "chmod 700" in run.stderr


# The other user's job: it makes its socket directory and puts a symlink to root's socket
# where its own socket would be. Debian's Python: nobody may not enter /root (pyenv).
SQUATTER = """
import os, sys
directory = os.environ["PROBING_SOCKET_DIR"]
os.symlink(sys.argv[1], os.path.join(directory, "%d.sock" % os.getpid()))
print("ready", os.getpid(), flush=True)
sys.stdin.read()
"""


def test_another_user_cannot_redirect_roots_command_into_roots_own_job(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs root (to be the victim) and /usr/bin/python3 (for nobody's job)")
    import pwd

    nobody = pwd.getpwnam("nobody")
    planted = Path(tempfile.mkdtemp(prefix="probing-nobody-"))
    os.chown(planted, nobody.pw_uid, nobody.pw_gid)  # nobody's own directory, mode 0700
    marker = tmp_path / "root-job-ran-the-code"
    try:
        with Target("sleeper.py", via="env") as root_job:
            root_socket = os.path.join(os.environ["PROBING_SOCKET_DIR"], f"{root_job.pid}.sock")
            squatter = subprocess.Popen(
                ["/usr/bin/python3", "-c", SQUATTER, root_socket],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/", user=nobody.pw_uid,
                group=nobody.pw_gid, env={"PROBING_SOCKET_DIR": str(planted), "PATH": "/usr/bin:/bin"},
            )  # fmt: skip
            try:
                assert squatter.stdout is not None
                ready = squatter.stdout.readline().decode().split()
                assert ready[:1] == ["ready"], ready
                code = f"open({str(marker)!r}, 'w').write('ran')"
                run = run_cli_measured(ready[1], "eval", code)
                backtrace = run_cli_measured(ready[1], "backtrace")
            finally:
                squatter.kill()
                squatter.wait(10)
            assert root_job.alive()
    finally:
        shutil.rmtree(planted, ignore_errors=True)
    assert_clear_error(run, ExitCode.PERMISSION_DENIED, "is a symlink")
    assert not marker.exists(), "root's job ran the code sent to nobody's job"
    assert_clear_error(backtrace, ExitCode.PERMISSION_DENIED, "is a symlink")
