"""The job's rendezvous store as the agent uses it: each listening rank publishes its endpoint
there, and any rank reads every rank's back for the CLI (which needs no torch for it).

Only through the job's own torch.distributed, the way torch.distributed.debug publishes its
per-rank servers: a TCPStore client of the store at MASTER_ADDR:MASTER_PORT that never waits
for workers (so it adds no key and counts as no worker), behind PrefixStore("probing") so that
no key of the job's is ever read or written. The agent never imports torch: the store is used
only once the job has imported torch.distributed completely.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from types import ModuleType
from typing import Any, Dict, List, Mapping, Optional

KEY_PREFIX = "probing"
STORE_TIMEOUT_S = 5.0


class RegistryUnavailable(Exception):
    """The store cannot be used (yet): the message says why."""


def _number(text: Optional[str]) -> Optional[int]:
    return int(text) if text is not None and text.strip().isdigit() else None


def rank_identity(environ: Optional[Mapping[str, str]] = None) -> Optional[Dict[str, Any]]:
    """Who this process is in a torchrun job (its environment), or None when it is no rank."""
    env = os.environ if environ is None else environ
    if _number(env.get("RANK")) is None:
        return None
    return {
        "rank": _number(env.get("RANK")),
        "local_rank": _number(env.get("LOCAL_RANK")),
        "group_rank": _number(env.get("GROUP_RANK")),
        "world_size": _number(env.get("WORLD_SIZE")),
        "local_world_size": _number(env.get("LOCAL_WORLD_SIZE")),
        "run_id": env.get("TORCHELASTIC_RUN_ID"),
    }


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


class Registry:
    """One store client, made on first use and kept; dropped after any failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._store: Any = None
        self._store_address: Optional[str] = None

    def _job(self) -> Dict[str, Any]:
        env = os.environ
        host, port = env.get("MASTER_ADDR"), _number(env.get("MASTER_PORT"))
        rank, world_size = _number(env.get("RANK")), _number(env.get("WORLD_SIZE"))
        if not host or port is None or rank is None or world_size is None:
            raise RegistryUnavailable(
                "this process is no torchrun rank (MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE "
                "are not all in its environment)"
            )
        attempt = env.get("TORCHELASTIC_RESTART_COUNT") or "0"
        return {"host": host, "port": port, "rank": rank, "world_size": world_size, "attempt": attempt}

    def _client(self, job: Dict[str, Any]) -> Any:
        """The prefixed store client (the lock is held)."""
        address = f"{job['host']}:{job['port']}"
        if self._store is not None and self._store_address == address:
            return self._store
        dist = loaded_torch_distributed()
        if dist is None:
            raise RegistryUnavailable("the job has not imported torch.distributed (yet)")
        from datetime import timedelta  # here: `hello` loads this module, and needs none of it

        try:
            client = dist.TCPStore(
                job["host"], job["port"], is_master=False, wait_for_workers=False,
                timeout=timedelta(seconds=STORE_TIMEOUT_S),
            )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - torch raises several kinds for an unreachable store
            raise RegistryUnavailable(f"cannot reach the job's store at {address}: {error}") from None
        self._store = dist.PrefixStore(KEY_PREFIX, client)
        self._store_address = address
        return self._store

    def register(self, endpoint: str) -> None:
        """Publish this rank's endpoint; RegistryUnavailable says why it could not."""
        env = os.environ
        with self._lock:
            job = self._job()
            value = {
                "rank": job["rank"],
                "local_rank": _number(env.get("LOCAL_RANK")),
                "group_rank": _number(env.get("GROUP_RANK")),
                "node": socket.gethostname(),
                "pid": os.getpid(),
                "endpoint": endpoint,
                "world_size": job["world_size"],
            }
            store = self._client(job)
            try:
                store.set(f"endpoint/{job['attempt']}/{job['rank']}", json.dumps(value))
            except Exception as error:  # noqa: BLE001
                self._store = None
                raise RegistryUnavailable(
                    f"the job's store at {self._store_address} failed: {error}"
                ) from None

    def unregister(self) -> None:
        """Take this rank's endpoint out (detach): best effort, the store may be gone."""
        with self._lock:
            if self._store is None:
                return
            try:
                job = self._job()
                self._store.delete_key(f"endpoint/{job['attempt']}/{job['rank']}")
            except Exception:  # noqa: BLE001, S110 - a detach must finish whatever the store does
                pass
            self._store = None

    def endpoints(self) -> Dict[str, Any]:
        """Every registered rank of this job's current attempt, sorted by rank."""
        with self._lock:
            job = self._job()
            store = self._client(job)
            ranks: List[Dict[str, Any]] = []
            try:
                for rank in range(job["world_size"]):
                    key = f"endpoint/{job['attempt']}/{rank}"
                    # check() first: get() of a missing key would block until the store's timeout.
                    if not store.check([key]):
                        continue
                    entry = _entry(store.get(key))
                    if entry is not None:
                        ranks.append(entry)
            except Exception as error:  # noqa: BLE001
                self._store = None
                raise RegistryUnavailable(
                    f"the job's store at {self._store_address} failed: {error}"
                ) from None
        ranks.sort(key=lambda entry: entry["rank"])
        return {
            "store": f"{job['host']}:{job['port']}",
            "world_size": job["world_size"],
            "attempt": _number(job["attempt"]),
            "ranks": ranks,
        }

    def forget(self) -> None:
        """In a forked child: drop the parent's client without a word to the store."""
        self._store = None
        self._lock = threading.Lock()


_ENTRY_FIELDS = ("rank", "local_rank", "group_rank", "node", "pid", "endpoint")


def _entry(raw: Any) -> Optional[Dict[str, Any]]:
    """A registry value as the reply carries it; None for one that is not ours to trust."""
    try:
        value = json.loads(bytes(raw).decode("utf-8"))
    except (ValueError, TypeError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("rank"), int):
        return None
    return {name: value.get(name) for name in _ENTRY_FIELDS}
