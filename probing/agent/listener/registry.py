"""The job's rendezvous store as the agent uses it: each listening rank publishes its endpoint
there, and any rank reads every rank's back for the CLI (which needs no torch for it).

Only through the job's own torch.distributed, the way torch.distributed.debug publishes its
per-rank servers: a TCPStore client of the store at MASTER_ADDR:MASTER_PORT that never waits
for workers (so it adds no key and counts as no worker), behind PrefixStore("probing") so that
no key of the job's is ever read or written. The agent never imports torch: the store is used
only once the job has imported torch.distributed completely.

A store can hang (a stopped process, a peer that accepts and never answers), and torch's own
timeout does not bound its socket I/O (measured: > 90 s in the constructor, > 40 s in check()).
So no store call ever runs in a thread that matters: each operation runs in a throwaway daemon
thread ("probing-store") that the caller waits on for at most a few seconds, holding no lock
meanwhile. At most one such thread lives per Registry: while one is out, a newcomer waits for it
within its own deadline, and once that one is overdue, every caller is answered at once.
"""

from __future__ import annotations

import os
import socket
import sys
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Set

from ...originals import Event, allocate_lock, get_ident, json_dumps, json_loads, monotonic
from ..threads import AgentThread
from .rank import env_number

KEY_PREFIX = "probing"
# How long a caller waits for the store: shorter than the CLI's default timeouts, so that a
# hung store is reported as such instead of the CLI giving up on the agent.
STORE_DEADLINE_S = 3.0
# Detach waits this long at most to take the endpoint out: a detach must stay fast.
UNREGISTER_DEADLINE_S = 1.0
STORE_THREAD_NAME = "probing-store"  # an OS name keeps 15 bytes

StoreOperation = Callable[[Any], Any]
# Store clients whose descriptor the job closed: alive for good, see Registry.abandon().
_ABANDONED_CLIENTS: List[Any] = []


class RegistryUnavailable(Exception):
    """The store cannot be used (yet): the message says why."""


def loaded_torch_distributed() -> Optional[ModuleType]:
    """torch.distributed once the job has imported it whole; never imported from here."""
    module = sys.modules.get("torch.distributed")
    if module is None:
        return None
    spec = getattr(module, "__spec__", None)
    if spec is None or getattr(spec, "_initializing", False):
        return None  # the job's own import is still running: its names may not exist yet
    if not hasattr(module, "TCPStore") or not hasattr(module, "PrefixStore"):
        return None  # a build without distributed support
    return module


class _StoreCall:
    """One operation on the store, in a thread of its own; the caller reads its outcome."""

    def __init__(self, dist: ModuleType, host: str, port: int, store: Any, operation: StoreOperation,
                 own_threads: Set[int], deadline: float) -> None:  # fmt: skip
        self.address = f"{host}:{port}"
        self._dist, self._host, self._port = dist, host, port
        self.store = store  # None: connect first
        self._operation = operation
        self._own_threads = own_threads
        self.deadline = deadline
        self.done = Event()
        self.result: Any = None
        self.error: Optional[str] = None

    def start(self) -> None:
        AgentThread(target=self._run, name=STORE_THREAD_NAME).start()

    def _run(self) -> None:
        self._own_threads.add(get_ident())
        try:
            if self.store is None:
                from datetime import timedelta  # here: only a rank that uses its store needs it

                try:
                    client = self._dist.TCPStore(
                        self._host, self._port, is_master=False, wait_for_workers=False,
                        timeout=timedelta(seconds=STORE_DEADLINE_S),
                    )  # fmt: skip
                except Exception as error:  # noqa: BLE001 - torch raises several kinds
                    self.error = f"cannot reach the job's store at {self.address}: {error}"
                    return
                self.store = self._dist.PrefixStore(KEY_PREFIX, client)
            try:
                self.result = self._operation(self.store)
            except Exception as error:  # noqa: BLE001
                self.error = f"the job's store at {self.address} failed: {error}"
        except BaseException as error:  # noqa: BLE001 - nothing may escape into the job
            self.error = f"the job's store at {self.address} failed: {type(error).__name__}: {error}"
        finally:
            self.done.set()
            self._own_threads.discard(get_ident())


def _job() -> Dict[str, Any]:
    env = os.environ
    host, port = env.get("MASTER_ADDR"), env_number(env.get("MASTER_PORT"))
    rank, world_size = env_number(env.get("RANK")), env_number(env.get("WORLD_SIZE"))
    if not host or port is None or rank is None or world_size is None:
        raise RegistryUnavailable(
            "this process is no torchrun rank (MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE "
            "are not all in its environment)"
        )
    attempt = env.get("TORCHELASTIC_RESTART_COUNT") or "0"
    return {"host": host, "port": port, "rank": rank, "world_size": world_size, "attempt": attempt}


class Registry:
    """One store client, made on first use and kept; dropped after any failure or timeout.

    `own_threads`: the agent's thread idents, which its store threads join (never in backtraces).
    """

    def __init__(self, own_threads: Set[int]) -> None:
        self._own_threads = own_threads
        self._lock = allocate_lock()  # guards the fields below; never held while waiting
        self._store: Any = None
        self._store_address: Optional[str] = None
        self._call: Optional[_StoreCall] = None  # the store thread out now, if any

    def _run(self, job: Dict[str, Any], operation: StoreOperation, timeout: float) -> Any:
        """`operation(prefixed store)` in a store thread, waited on for `timeout` at most."""
        address = f"{job['host']}:{job['port']}"
        dist = loaded_torch_distributed()
        if dist is None:
            raise RegistryUnavailable("the job has not imported torch.distributed (yet)")
        deadline = monotonic() + timeout
        late = RegistryUnavailable(f"the job's store at {address} did not answer within {timeout:g} s")
        while True:
            with self._lock:
                out = self._call
                if out is None or out.done.is_set():
                    store = self._store if self._store_address == address else None
                    call = _StoreCall(dist, job["host"], job["port"], store, operation,
                                      self._own_threads, deadline)  # fmt: skip
                    try:
                        call.start()
                    except RuntimeError:  # can't start new thread
                        raise RegistryUnavailable(f"cannot ask the store at {address}: no thread") from None
                    self._call = call
                    break
            # One thread per Registry: wait for the one out (its deadline or ours, whichever
            # comes first: one already overdue answers this caller at once).
            if not out.done.wait(max(0.0, min(out.deadline, deadline) - monotonic())):
                raise late
        finished = call.done.wait(max(0.0, deadline - monotonic()))
        with self._lock:
            if not finished or call.error is not None:
                # A client that hung or failed is not used again: the next call makes a new one.
                self._store, self._store_address = None, None
                if not finished:
                    raise late
                raise RegistryUnavailable(call.error)
            self._store, self._store_address = call.store, address
            return call.result

    def register(self, endpoint: str) -> None:
        """Publish this rank's endpoint; RegistryUnavailable says why it could not."""
        job = _job()
        env = os.environ
        value = {
            "rank": job["rank"],
            "local_rank": env_number(env.get("LOCAL_RANK")),
            "group_rank": env_number(env.get("GROUP_RANK")),
            "node": socket.gethostname(),
            "pid": os.getpid(),
            "endpoint": endpoint,
            "world_size": job["world_size"],
        }
        key, text = f"endpoint/{job['attempt']}/{job['rank']}", json_dumps(value)
        self._run(job, lambda store: store.set(key, text), STORE_DEADLINE_S)

    def unregister(self) -> None:
        """Take this rank's endpoint out (detach): best effort and bounded, the store may be gone
        or hung (a store thread still out and overdue: given up at once)."""
        try:
            job = _job()
            key = f"endpoint/{job['attempt']}/{job['rank']}"
            self._run(job, lambda store: store.delete_key(key), UNREGISTER_DEADLINE_S)
        except RegistryUnavailable:
            pass
        with self._lock:
            self._store, self._store_address = None, None

    def endpoints(self) -> Dict[str, Any]:
        """Every registered rank of this job's current attempt, sorted by rank."""
        job = _job()
        read: StoreOperation = lambda store: _read_entries(store, job)  # noqa: E731
        ranks: List[Dict[str, Any]] = self._run(job, read, STORE_DEADLINE_S)
        ranks.sort(key=lambda entry: entry["rank"])
        return {
            "store": f"{job['host']}:{job['port']}",
            "world_size": job["world_size"],
            "attempt": env_number(job["attempt"]),
            "ranks": ranks,
        }

    def abandon(self) -> None:
        """The job closed the agent's descriptors (os.closerange), the client's socket among
        them, and its number may be the job's file now: the client is kept, never used again
        and never destroyed (torch's destructor would close that number)."""
        with self._lock:
            if self._store is not None:
                _ABANDONED_CLIENTS.append(self._store)
            self._store, self._store_address = None, None

    def forget(self) -> None:
        """In a forked child: drop the parent's client (and its thread) without a word to the store."""
        self._store, self._store_address, self._call = None, None, None
        self._lock = allocate_lock()


def _present(store: Any, keys: List[str]) -> List[str]:
    """Those of `keys` the store holds, in few round trips: one check() when all are there (the
    usual case), else the halves that are not all there split again (k missing of n keys take
    about k·log2(n) checks, not n)."""
    if not keys or store.check(keys):
        return keys
    if len(keys) == 1:
        return []
    half = len(keys) // 2
    return _present(store, keys[:half]) + _present(store, keys[half:])


def _read_entries(store: Any, job: Dict[str, Any]) -> List[Dict[str, Any]]:
    keys = [f"endpoint/{job['attempt']}/{rank}" for rank in range(job["world_size"])]
    # Only keys that are there are read: get() of a missing key would block until the store's
    # timeout. All at once where the store can (multi_get: one round trip for 1 024 ranks).
    present = _present(store, keys)
    multi_get = getattr(store, "multi_get", None)
    values = multi_get(present) if multi_get is not None and present else [store.get(key) for key in present]
    ranks = []
    for raw in values:
        entry = _entry(raw)
        if entry is not None:
            ranks.append(entry)
    return ranks


_ENTRY_FIELDS = ("rank", "local_rank", "group_rank", "node", "pid", "endpoint")


def _entry(raw: Any) -> Optional[Dict[str, Any]]:
    """A registry value as the reply carries it; None for one that is not ours to trust."""
    try:
        value = json_loads(bytes(raw).decode("utf-8"))
    except (ValueError, TypeError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("rank"), int):
        return None
    return {name: value.get(name) for name in _ENTRY_FIELDS}
