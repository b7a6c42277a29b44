"""A job of N ranks on K simulated nodes, real parts: each node its own PID, mount and UTS
namespace (as tests/support.py's TwoNodeJob makes them: hostname nodeK, a private tmpfs for the
agents' sockets, loopback address 127.0.0.(K+2)), each rank a real Python process with the real
probing agent listening there with the token, registered in the job's real rendezvous store
(torch's TCPStore, store.py), found by the CLI as torchrun's ranks are. The ranks are forked
from one zygote per node (node.py) that imported torch and the agent once; see rank.py for what
they hold.

    with ScaleJob(ranks=256, nodes=4) as job:
        job.run_cli(0, "1", "backtrace", "--ranks", "all")

Everything started is killed on exit, on an exception or Ctrl-C too; if this process dies
unannounced, the zygotes and the store see their stdin close and end (with their ranks). All
traffic is on 127.0.0.0/8.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
PROBING = str(BIN / "probing")
sys.path.insert(0, str(HERE))

import rank as rank_body  # noqa: E402
from measure import children  # noqa: E402

TOKEN = "scale-harness-token-0123456789abcdef"
MAX_NODES = 200  # 127.0.0.2 .. 127.0.0.201
OUTPUT_LINES_KEPT = 200


def node_address(index: int) -> str:
    return f"127.0.0.{index + 2}"


def _inner_pid(pid: int) -> Optional[int]:
    """The PID of an outside process inside its own (innermost) PID namespace: NSpid's last."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


class SimNode:
    """One simulated machine: `unshare` runs a shell that names the host, mounts a private tmpfs
    on `private`, bind-mounts an /etc/hosts naming every node, then becomes the zygote (node.py),
    the namespace's init: killing it ends the node. `pids`: rank -> its PID inside the node."""

    def __init__(self, index: int, ranks_per_node: int, stuck_rank: int, environment: Dict[str, str],
                 private: str, hosts: str, on_line: Any,
                 paced: Optional[List[str]] = None) -> None:  # fmt: skip
        self.index = index
        self.name = f"node{index}"
        self.address = node_address(index)
        self.pids: Dict[int, int] = {}
        self.failures: List[str] = []
        self.stderr_lines: List[str] = []
        self._on_line = on_line
        hosts_file = shlex.quote(os.path.join(private, "hosts"))
        setup = (
            f"hostname {self.name} && mount -t tmpfs -o mode=0700 tmpfs {shlex.quote(private)} && "
            f"cp /etc/hosts {hosts_file} && printf {shlex.quote(hosts)} >> {hosts_file} && "
            f"mount --bind {hosts_file} /etc/hosts && exec "
        )
        zygote = [sys.executable, str(HERE / "node.py"), f"--node={index}",
                  f"--ranks-per-node={ranks_per_node}", f"--stuck-rank={stuck_rank}",
                  *(paced or [])]  # fmt: skip
        command = ["unshare", "--pid", "--mount", "--uts", "--fork", "--mount-proc", "--kill-child=SIGKILL",
                   "sh", "-c", setup + " ".join(shlex.quote(word) for word in zygote)]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=environment, start_new_session=True,
        )  # fmt: skip
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]  # fmt: skip
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            words = raw.decode(errors="replace").split()
            if len(words) == 3 and words[0] == "ready":
                self.pids[int(words[1])] = int(words[2])
            elif words and words[0] == "failed":
                self.failures.append(" ".join(words[1:]))
            self._on_line()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            self.stderr_lines = [
                *self.stderr_lines[-OUTPUT_LINES_KEPT:],
                raw.decode(errors="replace").rstrip(),
            ]
            self._on_line()

    @property
    def init_pid(self) -> Optional[int]:
        """The zygote's PID as seen from outside (what nsenter needs)."""
        under = children(self.process.pid)
        return under[0] if under else None

    def rank_pids_outside(self) -> Dict[int, int]:
        """rank -> its PID seen from outside, for the ranks alive now."""
        init = self.init_pid
        inner_to_rank = {pid: rank for rank, pid in self.pids.items()}
        found = {}
        for pid in children(init) if init else []:
            rank = inner_to_rank.get(_inner_pid(pid) or -1)
            if rank is not None:
                found[rank] = pid
        return found

    def command(self, argv: List[str]) -> List[str]:
        """argv run inside the node's PID, mount and UTS namespaces (its network is everyone's)."""
        init = self.init_pid
        if init is None:
            raise RuntimeError(f"{self.name} is not running")
        return ["nsenter", f"--target={init}", "--pid", "--mount", "--uts", "--", *argv]

    def signal_all(self, number: int) -> None:
        """`number` to the zygote and every rank (SIGSTOP: the node hangs, its sockets still
        accept; SIGCONT: it goes on)."""
        init = self.init_pid
        for pid in [init, *children(init)] if init else []:
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        if self.process.stdin is not None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        self.signal_all(signal.SIGCONT)  # a frozen node's init takes SIGKILL either way; be plain
        if self.process.poll() is None:
            self.process.kill()  # --kill-child: its child, the zygote, gets SIGKILL too
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            pass
        for reader in self._readers:
            reader.join(5)


class Store:
    """The job's TCPStore server (store.py) on node 0's address."""

    def __init__(self, host: str, private: str, hosts: str, timeout: float = 60.0) -> None:
        self.host = host
        # In a mount namespace of its own whose resolver reads only files, naming every node: torch's
        # server looks up each peer's name as it accepts it (getnameinfo of ::ffff:127.0.0.x, which
        # no hosts file names), and this machine's DNS, unreachable, cost 5 s per connection:
        # 256 ranks' agents saw the store accept nothing for 20 s. A cluster's DNS answers at once.
        hosts_file = shlex.quote(os.path.join(private, "hosts"))
        nsswitch = shlex.quote(os.path.join(private, "nsswitch.conf"))
        setup = (
            f"mount -t tmpfs -o mode=0700 tmpfs {shlex.quote(private)} && cp /etc/hosts {hosts_file} && "
            f"printf {shlex.quote(hosts)} >> {hosts_file} && mount --bind {hosts_file} /etc/hosts && "
            f"printf 'hosts: files\\n' > {nsswitch} && mount --bind {nsswitch} /etc/nsswitch.conf && exec "
        )
        store = " ".join(shlex.quote(word) for word in [sys.executable, str(HERE / "store.py"), host])
        self.process = subprocess.Popen(
            ["unshare", "--mount", "--fork", "--kill-child=SIGKILL", "sh", "-c", setup + store],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        port: List[int] = []
        reader = threading.Thread(target=lambda: port.extend(self._port_line()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not port:
            self.kill()
            raise RuntimeError(f"the store on {host} did not start within {timeout:g} s")
        self.port = port[0]

    def _port_line(self) -> List[int]:
        assert self.process.stdout is not None
        words = self.process.stdout.readline().split()
        return [int(words[1])] if len(words) == 2 and words[0] == b"store" else []

    def client(self) -> Any:
        import torch.distributed as dist

        return dist.TCPStore(self.host, self.port, is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=10))  # fmt: skip

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)


class ScaleJob:
    """`ranks` ranks over `nodes` simulated nodes (ranks divisible by nodes), rank `stuck_rank`
    (default: the last rank of the second node, or of node 0 alone) sleeping in load_shard,
    every other rank in all_reduce; or, given a `straggler`, every rank stepping once every
    `step_s` with that one late (rank.py). Ready once every rank said `ready` and every endpoint is in
    the store; everything is killed on exit, even when starting failed."""

    def __init__(self, ranks: int, nodes: int, stuck_rank: Optional[int] = None,
                 ready_timeout: float = 600.0, straggler: Optional[int] = None,
                 step_s: float = 1.0) -> None:  # fmt: skip
        if nodes < 1 or nodes > MAX_NODES or ranks % nodes:
            raise ValueError(
                f"{ranks} ranks cannot be spread evenly over {nodes} nodes (at most {MAX_NODES})"
            )
        if shutil.which("unshare") is None or shutil.which("nsenter") is None or os.geteuid() != 0:
            raise RuntimeError("simulated nodes need root and util-linux's unshare and nsenter")
        self.world_size, self.ranks_per_node = ranks, ranks // nodes
        self.stuck_rank = stuck_rank if stuck_rank is not None else min(2, nodes) * self.ranks_per_node - 1
        self.private = tempfile.mkdtemp(prefix="probing-scale-")
        self.shared = tempfile.mkdtemp(prefix="probing-scale-shared-")  # seen alike from every node
        self.socket_dir = os.path.join(self.private, "sockets")
        self.nodes: List[SimNode] = []
        self.store: Optional[Store] = None
        self._changed = threading.Event()
        started = time.monotonic()
        try:
            hosts = "".join(f"{node_address(index)} node{index}\n" for index in range(nodes))
            self.store = Store(node_address(0), self.private, hosts)
            # A job slow, not stuck (rank.py): every rank steps on one schedule, `straggler` late.
            paced = None
            if straggler is not None:
                paced = [f"--straggler={straggler}", f"--start-at={time.time():.3f}", f"--step-s={step_s}"]
            for index in range(nodes):
                environment = self._environment(index)
                self.nodes.append(SimNode(index, self.ranks_per_node, self.stuck_rank, environment,
                                          self.private, hosts, self._changed.set, paced))  # fmt: skip
            self._wait_ready(started + ready_timeout)
            self._wait_registered(started + ready_timeout)
        except BaseException:
            self.kill()
            raise
        self.start_seconds = time.monotonic() - started

    def _environment(self, index: int) -> Dict[str, str]:
        environment = {name: value for name, value in os.environ.items() if not name.startswith("PROBING")}
        assert self.store is not None
        environment.update(
            PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", WORLD_SIZE=str(self.world_size),
            LOCAL_WORLD_SIZE=str(self.ranks_per_node), GROUP_RANK=str(index), MASTER_ADDR=node_address(0),
            MASTER_PORT=str(self.store.port), TORCHELASTIC_RUN_ID="scale", TORCHELASTIC_RESTART_COUNT="0",
            PROBING_LISTEN=f"{node_address(index)}:0", PROBING_TOKEN=TOKEN,
            PROBING_SOCKET_DIR=self.socket_dir, **rank_body.placeholders(),
        )  # fmt: skip
        return environment

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            failures = [failure for node in self.nodes for failure in node.failures]
            ended = [node.name for node in self.nodes if node.process.poll() is not None]
            if failures or ended:
                raise RuntimeError(f"ranks failed {failures[:5]}, nodes ended {ended}:\n{self.output()}")
            if sum(len(node.pids) for node in self.nodes) == self.world_size:
                return
            self._changed.wait(1.0)
            self._changed.clear()
        raise RuntimeError(
            f"only {sum(len(n.pids) for n in self.nodes)} of {self.world_size} ranks got ready"
        )

    def registered_ranks(self, client: Any) -> List[int]:
        return [rank for rank in range(self.world_size) if client.check([f"probing/endpoint/0/{rank}"])]

    def _wait_registered(self, deadline: float) -> None:
        assert self.store is not None
        client = self.store.client()
        keys = [f"probing/endpoint/0/{rank}" for rank in range(self.world_size)]
        while time.monotonic() < deadline:
            if client.check(keys):
                return
            time.sleep(0.5)
        missing = sorted(set(range(self.world_size)) - set(self.registered_ranks(client)))
        raise RuntimeError(f"{len(missing)} ranks never registered their endpoint, e.g. {missing[:10]}")

    def cli_environment(self) -> Dict[str, str]:
        environment = {name: value for name, value in os.environ.items() if not name.startswith("PROBING")}
        environment.update(PROBING_TOKEN=TOKEN, PROBING_SOCKET_DIR=self.socket_dir)
        return environment

    def cli_command(self, node: int, *args: str) -> List[str]:
        """`probing ARGS` as run inside node `node`, where the zygote is PID 1."""
        return self.nodes[node].command([PROBING, *args])

    def endpoints_file(self) -> str:
        """A file of every rank's endpoint, read from the store (for `--endpoints @FILE`, the form
        multinode.md gives for jobs without torchrun's store); in the mount every node shares."""
        assert self.store is not None
        client = self.store.client()
        lines = [
            json.loads(client.get(f"probing/endpoint/0/{rank}"))["endpoint"]
            for rank in range(self.world_size)
        ]
        path = os.path.join(self.shared, "endpoints.txt")
        with open(path, "w") as handle:
            handle.write("\n".join(lines) + "\n")
        return path

    def node_of(self, rank: int) -> SimNode:
        return self.nodes[rank // self.ranks_per_node]

    def kill_ranks(self, ranks: List[int]) -> None:
        """SIGKILL those ranks (their zygote reaps them; their endpoints stay in the store)."""
        for rank in ranks:
            pid = self.node_of(rank).rank_pids_outside().get(rank)
            if pid is None:
                raise RuntimeError(f"rank {rank} is not running")
            os.kill(pid, signal.SIGKILL)

    def output(self) -> str:
        return "\n".join(
            f"--- {node.name} stderr ---\n" + "\n".join(node.stderr_lines[-20:]) for node in self.nodes
        )

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()
        if self.store is not None:
            self.store.kill()
        try:
            os.rmdir(self.private)  # empty: what the nodes wrote went with their tmpfs
        except OSError:
            pass
        shutil.rmtree(self.shared, ignore_errors=True)

    def __enter__(self) -> ScaleJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
