"""Real target processes for the integration tests, and the probing command to run at them.

Targets are tiny scripts under tests/targets/ that print "ready" when they are set up; the
tests wait for that line (never a sleep) and every target is killed in a fixture finaliser.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from tools import need, need_what_a_target_missed, need_what_the_cli_missed

TESTS = Path(__file__).resolve().parent
TARGETS = TESTS / "targets"
BIN = Path(sys.executable).parent
PROBING = str(BIN / "probing")
VENV_PYTHON = sys.executable

# CPython 3.14 and 3.15 with their own glibc, installed by `make pythons` (tools/pythons.sh) into
# .pythons/ of the checkout, or where $PROBING_PYTHONS_DIR says (CI keeps them outside its clone).
PYTHONS_DIR = Path(os.environ.get("PROBING_PYTHONS_DIR") or TESTS.parent / ".pythons")

# Every CPython the integration tests run the agent under: the pyenv versions, Debian's stripped
# system interpreter and `make pythons`' own. A missing one is skipped by name, never silently.
INTERPRETER_PATTERNS = {
    "3.8": "~/.pyenv/versions/3.8*/bin/python3.8",
    "3.9": "~/.pyenv/versions/3.9*/bin/python3.9",
    "3.10": "~/.pyenv/versions/3.10*/bin/python3.10",
    "3.11": "~/.pyenv/versions/3.11*/bin/python3.11",
    "3.12": "~/.pyenv/versions/3.12*/bin/python3.12",
    "3.13": "~/.pyenv/versions/3.13*/bin/python3.13",
    "debian-3.11": "/usr/bin/python3.11",
    "3.14": str(PYTHONS_DIR / "usr/bin/python3.14"),
    "3.15": str(PYTHONS_DIR / "usr/bin/python3.15"),
}


def find_interpreter(pattern: str) -> Optional[str]:
    matches = sorted(glob.glob(os.path.expanduser(pattern)))
    return matches[-1] if matches else None


def interpreter_params() -> List[object]:
    params: List[object] = []
    for name, pattern in INTERPRETER_PATTERNS.items():
        path = find_interpreter(pattern)
        installer = "; `make pythons` installs it" if pattern.startswith(str(PYTHONS_DIR)) else ""
        marks = [] if path else [pytest.mark.skip(reason=f"python {name} not found at {pattern}{installer}")]
        params.append(pytest.param(path, id=name, marks=marks))
    return params


def process_handle(pid: int) -> Any:
    """psutil's handle of the process that has `pid` now: it remembers its start time, so a
    later look knows whether the PID has passed to another process. None where it is gone."""
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def live_tree(handle: Any) -> List[Any]:
    """The process of `handle` and all its descendants, while it is still the process the handle
    was taken of; else nothing (psutil's is_running compares start times)."""
    import psutil

    try:
        if handle is None or not handle.is_running():
            return []
        return [*handle.children(recursive=True), handle]
    except psutil.Error:
        return []


class Target:
    """A target process. `via`: 'run' (probing run -- PYTHON script), 'env' (PROBING=1) or
    'plain' (no agent: for attaching to)."""

    def __init__(
        self,
        script: str,
        python: str = VENV_PYTHON,
        via: str = "run",
        args: Optional[List[str]] = None,
        env: Optional[Dict[str, str]] = None,
        ready_timeout: float = 60.0,
    ) -> None:
        environment = dict(os.environ, PYTHONUNBUFFERED="1")
        environment.pop("PROBING", None)
        environment.update(env or {})
        command = [python, str(TARGETS / script), *(args or [])]
        if via == "run":
            command = [PROBING, "run", "--", *command]
        elif via == "env":
            environment["PROBING"] = "1"
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
        )
        self.pid = self.process.pid  # until the child's PID is known (probing run)
        self._started = process_handle(self.pid)
        self.stdout_lines: List[str] = []
        self.stderr_lines: List[str] = []
        self._ready = threading.Event()
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout_lines, True)),
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr_lines, False)),
        ]
        for reader in self._readers:
            reader.daemon = True
            reader.start()
        # Set by "ready", or by the end of stdout: a target that died first (torch missing, a
        # crash) is reported now, not after the whole ready_timeout.
        self._ready.wait(ready_timeout)
        if not any(line.startswith("ready") for line in self.stdout_lines):
            self._readers[1].join(5)  # its last words, a traceback naming what it missed
            self.kill()
            need_what_a_target_missed("\n".join(self.stderr_lines))
            raise RuntimeError(f"target {script} never said ready: {self.output()}")
        self.pid = self._target_pid(via)
        self._started = process_handle(self.pid)

    def _read(self, stream: object, lines: List[str], watch: bool) -> None:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            line = raw.decode("utf-8", "replace").rstrip("\n")
            lines.append(line)
            if watch and line.startswith("ready"):
                self._ready.set()
        if watch:
            self._ready.set()  # stdout closed: no "ready" can come any more

    def _target_pid(self, via: str) -> int:
        if via != "run":
            return self.process.pid
        for line in self.stderr_lines:
            match = re.match(r"probing: started PID (\d+)", line)
            if match:
                return int(match.group(1))
        raise RuntimeError(f"probing run printed no PID: {self.stderr_lines}")

    def ready_line(self) -> str:
        return next(line for line in self.stdout_lines if line.startswith("ready"))

    def output(self) -> str:
        return "\n".join(self.stdout_lines) + "\n--- stderr ---\n" + "\n".join(self.stderr_lines)

    def state(self) -> str:
        """Whether it still runs, and its last 40 lines of output: for a test's failure message,
        when a job may have ended under a command (torchrun prints its ranks' tracebacks)."""
        lines = (self.stdout_lines + ["--- stderr ---"] + self.stderr_lines)[-40:]
        running = "alive" if self.alive() else "dead"
        return f"--- the job, PID {self.pid}, is {running}; its last output:\n" + "\n".join(lines)

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:  # reaped since
            return False

    def finish(self, timeout: float = 20.0) -> int:
        """Close the target's stdin (its signal to exit) and wait for it."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.close()
        except OSError:
            pass
        code = self.process.wait(timeout)
        for reader in self._readers:
            reader.join(5)
        return code

    def kill(self) -> None:
        """Kill the target and its descendants: a DataLoader worker stuck in __getitem__ never
        looks at whether its parent is alive, and would outlive the test. Only the process that
        said ready, by its start time: this machine's PIDs wrap at 32 768, and a PID that exited
        minutes ago may be another test's job (a stale PID here once took a torchrun launcher's
        ranks with it)."""
        import psutil

        for process in live_tree(self._started):
            try:
                process.kill()
            except psutil.Error:
                pass
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def read_ready_lines(
    stream: object, lines: List[str], pids: Dict[int, int], on_ready: Callable[[], None]
) -> None:
    """The lines of a rank's output stream until it closes; each `ready RANK PID` line (ranks_job.py)
    records the rank's PID and calls `on_ready`."""
    for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
        line = raw.decode("utf-8", "replace").rstrip("\n")
        lines.append(line)
        match = re.match(r"ready (\d+) (\d+)$", line)
        if match:
            pids[int(match.group(1))] = int(match.group(2))
            on_ready()


class TorchrunJob:
    """A real torchrun job of tests/targets/ranks_job.py (or of `script`, given `args` alone; gloo,
    CPU), `ranks` processes on this machine, standalone (its own rendezvous port, so two jobs never
    share one). Ready once every rank said `ready RANK PID`; `pids` maps rank to PID, `agent_pid`
    is torchrun's own process. The whole session (torchrun and its ranks) is killed on exit."""

    def __init__(self, scenario: str = "healthy", ranks: int = 4, args: Optional[List[str]] = None,
                 env: Optional[Dict[str, str]] = None, ready_timeout: float = 120.0,
                 script: str = "ranks_job.py") -> None:  # fmt: skip
        need("torch", "torchrun")
        self.script = script
        chosen = ["--scenario", scenario] if script == "ranks_job.py" else []
        environment = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        environment.pop("PROBING", None)
        environment.update(env or {})
        command = [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={ranks}",
                   str(TARGETS / script), *chosen, *(args or [])]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=environment, start_new_session=True,
        )  # fmt: skip
        self.agent_pid = self.process.pid
        self.pids: Dict[int, int] = {}
        self.stdout_lines: List[str] = []
        self.stderr_lines: List[str] = []
        self._ready = threading.Event()
        self._expected = ranks
        self._rank_handles: Dict[int, Any] = {}  # psutil.Process of each rank that said ready
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout_lines), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr_lines), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        if not self._ready.wait(ready_timeout):
            self.kill()
            raise RuntimeError(f"torchrun job never got ready: {self.output()}")

    def _read(self, stream: object, lines: List[str]) -> None:
        read_ready_lines(stream, lines, self.pids, self._count_ready)

    def _count_ready(self) -> None:
        for rank, pid in list(self.pids.items()):
            if rank not in self._rank_handles:
                self._rank_handles[rank] = process_handle(pid)
        if len(self.pids) == self._expected:
            self._ready.set()

    def output(self) -> str:
        return "\n".join(self.stdout_lines) + "\n--- stderr ---\n" + "\n".join(self.stderr_lines[-40:])

    def kill(self) -> None:
        """torchrun starts each rank in a session of its own: they are killed one by one, each
        only while it is the process that said ready (live_tree)."""
        import psutil

        processes = live_tree(process_handle(self.agent_pid)) if self.process.poll() is None else []
        # A rank whose torchrun died first is no child of it any more.
        for handle in list(self._rank_handles.values()):
            processes += live_tree(handle)
        for process in processes:
            try:
                process.kill()
            except psutil.Error:
                pass
        if self.process.poll() is None:  # its session, while its PID is still its own
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(30)

    def __enter__(self) -> TorchrunJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def probing(
    *args: str,
    input: Optional[str] = None,
    timeout: float = 60.0,
    env: Optional[Dict[str, str]] = None,
) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """Run the installed `probing` command; returns the completed process (text). The test is
    skipped when the CLI says a tool it runs (py-spy, pystack, gdb) is not installed here."""
    environment = dict(os.environ)
    environment.pop("PROBING", None)
    environment.update(env or {})
    result = subprocess.run(
        [PROBING, *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )
    if result.returncode != 0:
        need_what_the_cli_missed(result.stderr)
    return result


def run_bytes(command: List[str], env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """`command` (any program: a copy of the front end, the injector) with the test's environment
    less PROBING, plus `env`; its output as bytes, compared byte for byte."""
    environment = dict(os.environ)
    environment.pop("PROBING", None)
    environment.update(env or {})
    return subprocess.run(command, capture_output=True, timeout=60, env=environment)


def python_cli(pid: int) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """`probing PID backtrace` answered by the Python CLI (the native front end switched off)."""
    return run_bytes([PROBING, str(pid), "backtrace"], env={"PROBING_NATIVE_FRONT": "0"})


def agent_threads(pid: int) -> List[str]:
    """The OS names of a process's probing threads, sorted. The agent's threads are not
    threading's (probing/agent/threads.py): each names itself for the OS (comm, 15 bytes)."""
    names = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            name = Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()
        except OSError:
            continue  # it ended meanwhile
        if name.startswith("probing-"):
            names.append(name)
    return sorted(names)


def no_request_in_flight(pid: int, timeout: float = 10) -> bool:
    """Wait until the agent of `pid` serves no connection (no thread probing-conn-N): a job
    that then puts its own files on the agent's descriptor numbers meets no agent thread
    halfway through a system call on one (between its poll() and its recv(), say), which no
    check made beforehand could see coming."""
    serving = lambda: [name for name in agent_threads(pid) if name.startswith("probing-conn")]  # noqa: E731
    return wait_until(lambda: not serving(), timeout)


def agent_thread_ids(pid: int, name: str) -> List[int]:
    """The OS thread ids of a process's threads named `name` (comm)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            if Path(f"/proc/{pid}/task/{task}/comm").read_text().strip() == name:
                found.append(int(task))
        except OSError:
            continue
    return found


def wait_until(condition: object, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll a condition until it holds; for states with no event to wait on (a file removed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(condition())  # type: ignore[operator]


# What a test of simulated nodes needs, as skip marks with the reason: each node is made with
# `unshare` (PID, mount and UTS namespaces) and entered with `nsenter`, as root.
SIMULATED_NODES = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the simulated nodes need root (unshare, nsenter, mount)"),
    pytest.mark.skipif(
        shutil.which("unshare") is None or shutil.which("nsenter") is None,
        reason="util-linux unshare and nsenter not found",
    ),  # fmt: skip
]


# Two "nodes" on one machine: node N is a torchrun in PID, mount and UTS namespaces of its own
# (hostname nodeN, a private /tmp, its own /proc), sharing the network namespace so that the
# nodes talk over loopback, node N's agents on 127.0.0.(N+2). A CLI run in node 0's namespaces
# cannot see node 1's processes or sockets: it must reach them over TCP.
NODE_HOSTS = "127.0.0.2 node0\n127.0.0.3 node1\n"


def node_address(index: int) -> str:
    return f"127.0.0.{index + 2}"


def free_port(address: str) -> int:
    """A port nothing listens on now (the job's rendezvous store takes it a moment later)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


class Node:
    """One simulated machine of a TwoNodeJob: `unshare` starts a shell that names the host, mounts
    a tmpfs of its own on `private` (the agents' socket directory and the node's files: the same
    path holds something else on each node), makes node0/node1 resolve (a bind-mounted
    /etc/hosts), and becomes torchrun, the namespace's init: killing it kills the node. `pids`
    maps rank to its PID inside the node. Not a tmpfs on /tmp: the checkout and its venv may live
    there (CI clones into /tmp), and the node must still run them."""

    def __init__(self, index: int, torchrun: List[str], environment: Dict[str, str],
                 on_ready: Callable[[], None], private: str) -> None:  # fmt: skip
        self.index = index
        self.name = f"node{index}"
        self.address = node_address(index)
        self.pids: Dict[int, int] = {}
        self.stdout_lines: List[str] = []
        self.stderr_lines: List[str] = []
        self._on_ready = on_ready
        hosts = shlex.quote(os.path.join(private, "hosts"))
        setup = (
            f"hostname {self.name} && mount -t tmpfs -o mode=0700 tmpfs {shlex.quote(private)} && "
            f"cp /etc/hosts {hosts} && printf '{NODE_HOSTS}' >> {hosts} && "
            f"mount --bind {hosts} /etc/hosts && exec "
        )
        command = ["unshare", "--pid", "--mount", "--uts", "--fork", "--mount-proc", "--kill-child=SIGKILL",
                   "sh", "-c", setup + " ".join(shlex.quote(word) for word in torchrun)]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=environment, start_new_session=True,
        )  # fmt: skip
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout_lines), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr_lines), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: object, lines: List[str]) -> None:
        read_ready_lines(stream, lines, self.pids, self._on_ready)

    @property
    def init_pid(self) -> Optional[int]:
        """The PID, as seen from outside, of the node's init (torchrun): what nsenter needs."""
        import psutil

        if self.process.poll() is not None:  # gone and reaped: its PID may be anyone's now
            return None
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.Error:
            return None
        return children[0].pid if children else None

    def processes(self) -> List[int]:
        """Outside PIDs of every process of the node: its init and all under it."""
        import psutil

        init = self.init_pid
        if init is None:
            return []
        try:
            return [init, *(child.pid for child in psutil.Process(init).children(recursive=True))]
        except psutil.Error:
            return []

    def command(self, argv: List[str]) -> List[str]:
        """argv run inside the node's PID, mount and UTS namespaces (its network is everyone's)."""
        init = self.init_pid
        assert init is not None, f"{self.name} is not running"
        return ["nsenter", f"--target={init}", "--pid", "--mount", "--uts", "--", *argv]

    def freeze(self) -> None:
        """SIGSTOP every process of the node: its sockets still accept connections (the kernel
        completes the handshake) but nothing answers, as with a machine that hangs."""
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL to the namespace's init makes the kernel kill every process in it."""
        init = self.init_pid
        if init is not None:
            try:
                os.kill(init, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process.poll() is None:
            self.process.kill()  # --kill-child: its child, the init, gets SIGKILL too
        self.process.wait(30)
        for reader in self._readers:
            reader.join(5)

    def output(self) -> str:
        return (f"--- {self.name} stdout ---\n" + "\n".join(self.stdout_lines[-40:]) +
                f"\n--- {self.name} stderr ---\n" + "\n".join(self.stderr_lines[-40:]))  # fmt: skip


class TwoNodeJob:
    """A torchrun job of tests/targets/ranks_job.py over two simulated nodes (Node), `ranks_per_node`
    ranks each (gloo, CPU, static rendezvous on node 0's address). Every agent has the token TOKEN;
    on a `listening` node, the agents listen on its address (PROBING_LISTEN=127.0.0.N:0). Ready once
    every rank said `ready RANK PID` and, when `registered`, every listening rank's endpoint is in the
    job's rendezvous store. Both nodes are killed on exit, even when starting failed."""

    TOKEN = "two-node-test-token-0123456789abcdef"

    def __init__(self, scenario: str = "healthy", ranks_per_node: int = 2, args: Optional[List[str]] = None,
                 registered: bool = True, env: Optional[Dict[str, str]] = None,
                 listening: Tuple[bool, bool] = (True, True),
                 ready_timeout: float = 150.0) -> None:  # fmt: skip
        need("torch", "torchrun", "unshare")
        self.world_size = 2 * ranks_per_node
        self.master_port = free_port(node_address(0))
        # Each node mounts its own tmpfs here: its agents' sockets and its files (node_path).
        self.private = tempfile.mkdtemp(prefix="probing-nodes-")
        self.socket_dir = os.path.join(self.private, "sockets")
        self.nodes: List[Node] = []
        self._ready = threading.Event()
        try:
            for index in range(2):
                # Gloo must use lo: the hostnames node0/node1 mean nothing to its address lookup.
                environment = dict(
                    os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo"
                )
                environment.update(
                    PROBING="1", PROBING_LISTEN=f"{node_address(index)}:0", PROBING_TOKEN=self.TOKEN
                )
                environment["PROBING_SOCKET_DIR"] = self.socket_dir  # in the node's own tmpfs
                if not listening[index]:
                    del environment["PROBING_LISTEN"]
                environment.update(env or {})
                torchrun = [str(BIN / "torchrun"), "--nnodes=2", f"--node-rank={index}",
                            f"--nproc-per-node={ranks_per_node}", f"--master-addr={node_address(0)}",
                            f"--master-port={self.master_port}", f"--local-addr={node_address(index)}",
                            str(TARGETS / "ranks_job.py"), "--scenario", scenario, *(args or [])]  # fmt: skip
                self.nodes.append(Node(index, torchrun, environment, self._count_ready, self.private))
            if not self._ready.wait(ready_timeout):
                raise RuntimeError(f"the two-node job never got ready:\n{self.output()}")
            self.listening = [rank for node in self.nodes if listening[node.index] for rank in node.pids]
            if registered and not wait_until(self.all_registered, timeout=60, interval=0.2):
                raise RuntimeError(f"not every rank registered its endpoint:\n{self.output()}")
        except BaseException:
            self.kill()
            raise

    def _count_ready(self) -> None:
        if sum(len(node.pids) for node in self.nodes) == self.world_size:
            self._ready.set()

    def node_of(self, rank: int) -> Node:
        return next(node for node in self.nodes if rank in node.pids)

    def registered_ranks(self) -> List[int]:
        """Ranks whose endpoint is in the job's store, read as any store client would (torch's)."""
        from datetime import timedelta

        import torch.distributed as dist

        try:
            store = dist.TCPStore(node_address(0), self.master_port, is_master=False, wait_for_workers=False,
                                  timeout=timedelta(seconds=5))  # fmt: skip
        except (RuntimeError, dist.DistStoreError):
            return []
        keys = [f"probing/endpoint/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{rank}"
                for rank in range(self.world_size)]  # fmt: skip
        return [rank for rank, key in enumerate(keys) if store.check([key])]

    def all_registered(self) -> bool:
        """Every rank of a listening node is in the store."""
        return sorted(self.registered_ranks()) == sorted(self.listening)

    def probing(self, node: int, *args: str, env: Optional[Dict[str, Optional[str]]] = None,
                timeout: float = 90.0) -> subprocess.CompletedProcess:  # type: ignore[type-arg]  # fmt: skip
        """Run `probing ARGS` inside node `node`'s namespaces with the job's token (`env` overrides;
        None unsets a variable). Its PIDs are the node's own: torchrun is PID 1 there."""
        return subprocess.run(self.nodes[node].command([PROBING, *args]), capture_output=True, text=True,
                              timeout=timeout, env=self.cli_environment(env))  # fmt: skip

    def start_probing(self, node: int, *args: str,
                      env: Optional[Dict[str, Optional[str]]] = None) -> subprocess.Popen:  # type: ignore[type-arg]  # fmt: skip
        """`probing ARGS` in node `node`, not waited for (to kill a node while it runs)."""
        return subprocess.Popen(self.nodes[node].command([PROBING, *args]), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.cli_environment(env))  # fmt: skip

    def cli_environment(self, env: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, str]:
        environment = dict(os.environ, PROBING_TOKEN=self.TOKEN, PROBING_SOCKET_DIR=self.socket_dir)
        for name in ("PROBING", "PROBING_LISTEN"):
            environment.pop(name, None)
        for name, value in (env or {}).items():
            if value is None:
                environment.pop(name, None)
            else:
                environment[name] = value
        return environment

    def in_node(self, node: int, *argv: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
        """Any command inside a node's namespaces (to look at its /tmp)."""
        return subprocess.run(
            self.nodes[node].command(list(argv)), capture_output=True, text=True, timeout=30
        )

    def output(self) -> str:
        return "\n".join(node.output() for node in self.nodes)

    def node_path(self, name: str) -> str:
        """A path that is each node's own: the same name holds a different file on each."""
        return os.path.join(self.private, name)

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()
        try:
            os.rmdir(self.private)  # empty here: what the nodes wrote went with their tmpfs
        except OSError:
            pass

    def __enter__(self) -> TwoNodeJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    """`size` bytes from `sock`, or fewer if the peer closes first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def listener_of(pid: int) -> Dict[str, object]:
    """The agent's own word on its listener (its hello), read over its Unix socket."""
    from probing.client.connection import Client
    from probing.client.discovery import locate_socket

    with Client(locate_socket(pid), 10.0, pid=pid) as client:
        client.call("ping")
        listener = client.info.get("listener")
    assert isinstance(listener, dict), client.info
    return listener


def listening_endpoint(target: Target) -> str:
    """HOST:PORT of the target's agent's TCP listener (PROBING_LISTEN=127.0.0.1:0 chose it)."""
    endpoint = listener_of(target.pid)["endpoint"]
    assert isinstance(endpoint, str) and endpoint.startswith("127.0.0.1:")
    return endpoint
