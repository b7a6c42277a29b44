"""The agent's contract with the process it lives in: socket rules, fork safety, several
clients, idempotent start, clean stop, and silence on the job's stdout/stderr."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List

import pytest

from probing.errors import ExitCode
from probing.protocol.frames import MAX_REPLY_BYTES, recv_frame, send_frame
from probing.protocol.messages import PROTOCOL_VERSION, request

from support import VENV_PYTHON, Target, interpreter_params, probing, wait_until


def socket_of(target: Target) -> str:
    return os.path.join(os.environ["PROBING_SOCKET_DIR"], f"{target.pid}.sock")


def test_socket_is_private_and_removed_at_exit(sleeper: Target) -> None:
    path = socket_of(sleeper)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    assert sleeper.finish() == 0
    assert not os.path.exists(path)


def test_default_socket_directory_is_per_user() -> None:
    with Target("sleeper.py", env={"PROBING_SOCKET_DIR": ""}) as target:
        path = f"/tmp/probing-{os.geteuid()}/{target.pid}.sock"
        assert os.path.exists(path)
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        # The CLI finds it even though its own PROBING_SOCKET_DIR points elsewhere.
        assert probing(str(target.pid), "backtrace").returncode == 0
        assert target.finish() == 0
        assert not os.path.exists(path)


def test_the_agent_starts_from_the_pth_file_with_probing_set() -> None:
    with Target("sleeper.py", via="env") as target:
        assert probing(str(target.pid), "backtrace").returncode == 0


@pytest.mark.parametrize("value", ["0", "", "off"])
def test_probing_off_means_no_agent(value: str) -> None:
    output = subprocess.run(
        [
            VENV_PYTHON,
            "-c",
            "import threading, sys; print([t.name for t in threading.enumerate()])",
        ],
        env=dict(os.environ, PROBING=value),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (output.stdout, output.stderr) == ("['MainThread']\n", "")


@pytest.mark.parametrize("python", interpreter_params())
def test_a_forked_child_never_serves_on_its_parents_socket(python: str) -> None:
    with Target("forker.py", python=python) as parent:
        child = int(parent.ready_line().split("=")[1])
        path = socket_of(parent)
        # The child holds no copy of the parent's listening socket or of any connection.
        listener_inode = _unix_socket_inode(path)
        child_sockets = _socket_inodes(child)
        assert listener_inode is not None and listener_inode not in child_sockets
        # It has no agent of its own and is not confused with its parent.
        result = probing(str(child), "--no-attach", "eval", "1")
        assert result.returncode == ExitCode.NO_AGENT, result.stderr
        # When it exits normally (running the atexit handlers it inherited), the parent's
        # socket stays and the parent still answers.
        assert parent.process.stdin is not None
        parent.process.stdin.write(b"release-child\n")
        parent.process.stdin.flush()
        assert wait_until(lambda: "child exited" in parent.stdout_lines)
        assert os.path.exists(path)
        assert probing(str(parent.pid), "backtrace").returncode == 0


def _unix_socket_inode(path: str) -> int | None:
    with open("/proc/net/unix") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == path:
                return int(fields[6])
    return None


def _socket_inodes(pid: int) -> List[int]:
    inodes = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.append(int(link[8:-1]))
    return inodes


def test_several_clients_at_once(sleeper: Target) -> None:
    slow = ThreadPoolExecutor(1).submit(
        probing, str(sleeper.pid), "eval", "import time; time.sleep(1.5); 'slow done'"
    )
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: probing(str(sleeper.pid), "backtrace"), range(16)))
    # Backtraces were answered while the slow eval was still running.
    assert not slow.done()
    assert [result.returncode for result in results] == [0] * 16
    assert slow.result().stdout == "'slow done'\n"


def test_start_is_idempotent(sleeper: Target) -> None:
    # The agent's threads are not threading's (agent/threads.py): the OS names them.
    code = (
        "import os, probing.agent as agent\n"
        "agent.start(); agent.start()\n"
        "sum(open(f'/proc/self/task/{task}/comm').read().strip() == 'probing-agent'\n"
        "    for task in os.listdir('/proc/self/task'))"
    )
    assert probing(str(sleeper.pid), "eval", code).stdout == "1\n"


def test_stop_removes_its_threads_and_socket(sleeper: Target) -> None:
    tasks_before = set(os.listdir(f"/proc/{sleeper.pid}/task"))
    stop = "import threading, probing.agent as agent\nthreading.Timer(0.2, agent.stop).start()"
    assert probing(str(sleeper.pid), "eval", stop).returncode == 0
    assert wait_until(lambda: not os.path.exists(socket_of(sleeper)))
    # Main thread and the job's worker remain; every agent thread (and the timer) is gone.
    assert wait_until(lambda: len(os.listdir(f"/proc/{sleeper.pid}/task")) == 2), os.listdir(
        f"/proc/{sleeper.pid}/task"
    )
    assert set(os.listdir(f"/proc/{sleeper.pid}/task")) < tasks_before
    assert probing(str(sleeper.pid), "--no-attach", "eval", "1").returncode == ExitCode.NO_AGENT
    assert sleeper.finish() == 0


def test_the_agent_never_writes_to_the_jobs_stdout_or_stderr(sleeper: Target) -> None:
    pid = str(sleeper.pid)
    probing(pid, "backtrace", "--locals")
    probing(pid, "eval", "import sys; print('x'); print('y', file=sys.stderr)")
    probing(pid, "eval", "1/0")
    probing(pid, "eval", "def broken(:")
    probing(pid, "eval", "--timeout", "0.3", "while True: pass")
    probing(pid, "query", "SELECT nope")
    probing(pid, "query", "SELECT * FROM python.threads")
    probing(pid, "backtrace", "--thread", "nope")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(socket_of(sleeper))
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n")
        raw.recv(4096)
    assert sleeper.finish() == 0
    assert [line.split()[0] for line in sleeper.stdout_lines] == ["ready"]
    assert [line for line in sleeper.stderr_lines if not line.startswith("probing: started PID")] == []


def test_another_users_connection_is_refused() -> None:
    """Defence in depth: even if the 0700 directory is opened up, SO_PEERCRED keeps others out."""
    python = shutil.which("python3", path="/usr/bin")
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or python is None or setpriv is None:
        pytest.skip("needs root, setpriv and a system python to act as another user")
    with tempfile.TemporaryDirectory() as directory, Target(
        "sleeper.py", env={"PROBING_SOCKET_DIR": directory}
    ) as target:
        path = os.path.join(directory, f"{target.pid}.sock")
        os.chmod(directory, 0o711)
        os.chmod(path, 0o666)
        client = (
            "import socket, struct, json\n"
            f"s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect({path!r})\n"
            "head = s.recv(12); magic, hl, pl = struct.unpack('>4sII', head)\n"
            "print(json.loads(s.recv(hl))['error']['type'])"
        )
        result = subprocess.run(
            [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", client],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert result.stdout.strip() == "PermissionDenied", result.stderr
        # ... and the CLI no longer trusts the opened-up directory
        # (tests/integration/hostile/test_client_trust.py).
        refused = probing(str(target.pid), "backtrace")
        assert refused.returncode == 5 and "chmod 700" in refused.stderr, refused.stderr


def test_another_user_gets_permission_denied(sleeper: Target) -> None:
    python = shutil.which("python3", path="/usr/bin")
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or python is None or setpriv is None:
        pytest.skip("needs root, setpriv and a system python to act as another user")
    # The backtrace path needs nothing but the probing package: give that user a copy.
    import probing as package

    with tempfile.TemporaryDirectory() as copy:
        os.chmod(copy, 0o755)
        shutil.copytree(os.path.dirname(package.__file__), os.path.join(copy, "probing"))
        for root, dirs, files in os.walk(copy):
            for name in dirs + files:
                os.chmod(os.path.join(root, name), 0o755)
        code = f"import sys; sys.path.insert(0, {copy!r}); from probing.cli import main; sys.exit(main())"
        result = subprocess.run(
            [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", code,
             str(sleeper.pid), "backtrace"],
            capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]},
        )  # fmt: skip
    assert result.returncode == ExitCode.PERMISSION_DENIED, result.stderr
    assert "probing: error: not allowed" in result.stderr and "hint:" in result.stderr


def test_socket_directory_owned_by_someone_else_is_refused(tmp_path: object) -> None:
    """A directory planted by another user in a shared /tmp must not receive our socket."""
    planted = os.path.join(str(tmp_path), "planted")
    os.mkdir(planted, 0o777)
    os.chown(planted, 65534, 65534)
    if os.stat(planted).st_uid != 65534:
        pytest.skip("cannot chown here")
    code = (
        "import probing.agent as agent, os\n"
        f"print(agent.start({planted!r}), agent.last_error, os.listdir({planted!r}))"
    )
    output = subprocess.run([VENV_PYTHON, "-c", code], capture_output=True, text=True, timeout=30)
    assert output.stdout.startswith("False PermissionError:") and output.stdout.endswith("[]\n")
    assert output.stderr == ""


def test_hello_names_the_process(sleeper: Target) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(10)
        raw.connect(socket_of(sleeper))
        send_frame(raw, request(1, "hello", {"protocol": PROTOCOL_VERSION}))
        frame = recv_frame(raw, MAX_REPLY_BYTES)
    assert frame is not None
    info = frame.header["result"]
    assert info["pid"] == sleeper.pid and info["argv"][0].endswith("sleeper.py")
    assert json.loads(json.dumps(info)) == info
    assert threading.current_thread()  # the test thread is untouched by any of this


def test_sockets_of_dead_processes_are_swept_at_start(tmp_path: object) -> None:
    """A job killed by SIGTERM or SIGKILL runs no atexit: the next agent cleans up after it."""
    directory = os.path.join(str(tmp_path), "sockets")
    os.mkdir(directory, 0o700)
    dead = subprocess.Popen([VENV_PYTHON, "-c", "pass"])
    dead.wait()
    stale = os.path.join(directory, f"{dead.pid}.sock")
    with socket.socket(socket.AF_UNIX) as left_behind:
        left_behind.bind(stale)
    unrelated = os.path.join(directory, "notes.txt")
    open(unrelated, "w").close()
    with Target("sleeper.py", env={"PROBING_SOCKET_DIR": directory}) as target:
        assert wait_until(lambda: not os.path.exists(stale))
        assert os.path.exists(unrelated) and os.path.exists(os.path.join(directory, f"{target.pid}.sock"))
