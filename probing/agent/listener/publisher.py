"""Publishing a listening rank's endpoint in the job's rendezvous store (registry.py), on the
listener's schedule: tried once the job has imported torch.distributed itself, retried 0.5 s
growing to 5 s apart until it succeeds, each attempt in a short thread of its own, since the store
may take seconds to answer and the listener's thread must keep serving handshakes meanwhile.
"""

from __future__ import annotations

from typing import Callable, Optional, Set

from ...originals import get_ident, monotonic
from ..threads import AgentThread
from .registry import Registry, RegistryUnavailable, loaded_torch_distributed

REGISTRY_THREAD_NAME = "probing-publish"  # an OS name keeps 15 bytes
REGISTER_FIRST_DELAY_S = 0.5
REGISTER_MAX_DELAY_S = 5.0


class Publisher:
    """Whether this rank's endpoint is in the store, and why not. `registry` None: the process
    is no torchrun rank, and there is nothing to publish."""

    def __init__(
        self, registry: Optional[Registry], endpoint: str, own_threads: Set[int], wake: Callable[[], None]
    ) -> None:
        self.registry = registry
        self.endpoint = endpoint
        self.own_threads = own_threads
        self.wake = wake  # the listener's thread recomputes its timeout when an attempt ends
        self.registered = False
        self.error: Optional[str] = None
        self._delay = REGISTER_FIRST_DELAY_S
        self._at = monotonic()
        self._running = False
        self._stopping = False

    def due_at(self) -> Optional[float]:
        """When the next attempt is due (monotonic), or None when none will be."""
        if self.registry is None or self.registered or self._running or self._stopping:
            return None
        return self._at

    def maybe_start(self, now: float) -> None:
        due = self.due_at()
        if due is None or now < due:
            return
        if loaded_torch_distributed() is None:
            self.error = "waiting for the job to import torch.distributed"
            self._retry_later()
            return
        self._running = True
        worker = AgentThread(target=self._attempt, name=REGISTRY_THREAD_NAME)
        try:
            worker.start()  # it adds itself to the agent's threads: it may be gone before we could
        except RuntimeError:  # can't start new thread: try again later
            self._running = False
            self._retry_later()

    def _attempt(self) -> None:
        self.own_threads.add(get_ident())
        registry = self.registry
        try:
            if registry is not None and not self._stopping:
                registry.register(self.endpoint)
                self.registered = True
                self.error = None
                if self._stopping:  # detached while the store answered: take it back out
                    registry.unregister()
                    self.registered = False
        except RegistryUnavailable as error:
            self.error = str(error)
            self._retry_later()
        except Exception as error:  # noqa: BLE001 - a failure here must never reach the job
            self.error = f"{type(error).__name__}: {error}"
            self._retry_later()
        finally:
            self._running = False
            self.own_threads.discard(get_ident())
            self.wake()

    def _retry_later(self) -> None:
        self._at = monotonic() + self._delay
        self._delay = min(self._delay * 2, REGISTER_MAX_DELAY_S)

    def stop(self) -> None:
        """Out of the registry (detach): whoever finds the port closed must not find it listed.
        Bounded (registry.py): a hung store must not hold the detach."""
        self._stopping = True
        if self.registry is not None and self.registered:
            self.registry.unregister()
            self.registered = False

    def abandon(self) -> None:
        """The job closed the listener's descriptors: the store client's socket went with them,
        and its number may be the job's now: never touch it again."""
        self._stopping = True
        if self.registry is not None:
            self.registry.abandon()
        self.registered = False

    def forget(self) -> None:
        """In a forked child: the store client is the parent's."""
        self._stopping = True
        if self.registry is not None:
            self.registry.forget()
