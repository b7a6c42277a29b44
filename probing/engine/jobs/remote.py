"""The ranks of a job on other nodes: found through the job's own rendezvous store, or from a
list of endpoints the user gives (`--endpoints`), and reached over authenticated TCP.

Each listening rank's agent registers its endpoint in the store torchrun's ranks already share
(contract: `endpoints` method). One local agent reads the registry for the CLI, so the CLI needs
no torch and talks to no store. What the registry and the agents say is the job's: untrusted
input, checked field by field here.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...client.connection import Client
from ...client.discovery import locate_socket
from ...client.tcp import SCHEME, endpoint_url, split_endpoint
from ...errors import AgentTimeout, ProbingError, UsageError
from ...protocol.endpoints import AddressError, parse_endpoint
from .job import Job, Rank

# How many local agents may be asked for the registry before giving up on it.
ASK_AT_MOST = 3
# How many endpoints --endpoints may name (a file of them is the job's size, not unbounded).
MAX_ENDPOINTS = 4096
MAX_ENDPOINTS_FILE_BYTES = 1 << 20
# The most ranks reported unreachable one by one (WORLD_SIZE is the job's text).
MAX_WORLD = 1 << 16

NO_LOCAL_AGENT = "not reachable from this node: no agent runs on this node's ranks to read the job's registry"
UNREADABLE_REGISTRY = "not reachable from this node: the registry of endpoints could not be read"
# What waiting on threads that keep their own deadline adds to it (their last steps, a join).
JOIN_SLACK_S = 0.5
NOT_LISTENING = (
    "not reachable from this node: its agent does not listen (on its node: PROBING_LISTEN=auto "
    "with PROBING_TOKEN when starting the job, or `probing PID listen`)"
)


def _integer(value: Any, low: int = 0, high: int = 1 << 20) -> Optional[int]:
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    return None


def _text(value: Any, limit: int = 256) -> Optional[str]:
    return value if isinstance(value, str) and 0 < len(value) <= limit and value.isprintable() else None


def registered_rank(
    entry: Any, run_id: Optional[str] = None, world_size: Optional[int] = None
) -> Optional[Rank]:
    """A remote Rank of the job (`run_id`, `world_size`) from one entry of the registry; None for
    an entry that is not one."""
    if not isinstance(entry, dict):
        return None
    rank, pid = _integer(entry.get("rank")), _integer(entry.get("pid"), 1, 1 << 31)
    endpoint = _text(entry.get("endpoint"))
    if rank is None or pid is None or endpoint is None:
        return None
    try:
        parse_endpoint(endpoint)
    except AddressError:
        return None
    local_rank = _integer(entry.get("local_rank"))
    node = _integer(entry.get("group_rank"))
    return Rank(rank, rank if local_rank is None else local_rank, 0 if node is None else node, pid,
                endpoint, _text(entry.get("node")), remote=True, run_id=run_id,
                world_size=world_size)  # fmt: skip


def _unreachable(job: Job, rank: int, why: str) -> Rank:
    """A rank no one here can reach; its local rank and node as torchrun gives them on nodes of
    this node's size."""
    size = len(job.ranks) + len(job.absent)
    local, node = (rank % size, rank // size) if size else (rank, 0)
    return Rank(rank, local, node, 0, unreachable=why)


def merge_registry(job: Job, registry: Optional[Dict[str, Any]], why_none: str = NOT_LISTENING) -> Job:
    """`job` with the ranks the registry (the `endpoints` result, or None) names that are not on
    this node as remote ranks, the endpoints of the local ones filled in, and every other rank
    of the world reported unreachable with `why_none`."""
    entries = registry.get("ranks") if isinstance(registry, dict) else None
    registered: Dict[int, Rank] = {}
    for entry in entries if isinstance(entries, list) else []:
        each = registered_rank(entry, job.run_id, job.world_size)
        if each is not None and each.rank < job.world_size:
            registered.setdefault(each.rank, each)
    local = []
    for rank in job.ranks:
        found = registered.get(rank.rank)
        if found is not None:
            rank = Rank(rank.rank, rank.local_rank, rank.node, rank.pid, found.endpoint, found.host)
        local.append(rank)
    here = {rank.rank for rank in job.ranks + job.absent}
    remote = [rank for number, rank in sorted(registered.items()) if number not in here]
    known = here | {rank.rank for rank in remote}
    remote += [
        _unreachable(job, rank, why_none)
        for rank in range(min(job.world_size, MAX_WORLD))
        if rank not in known
    ]
    return Job(job.run_id, job.launcher, job.master, job.world_size, local, job.absent,
               sorted(remote), job.notes)  # fmt: skip


def ask_registry(
    job: Job, timeout: float, log: Callable[[str], None]
) -> Tuple[Optional[Dict[str, Any]], str]:
    """The `endpoints` result of the first local agent that gives one, or None and why the other
    nodes' ranks cannot be reached. Up to ASK_AT_MOST agents (never attached) are asked at once,
    all within `timeout`: a store that does not answer holds each of them alike."""
    sockets: List[Tuple[Rank, str]] = []
    for rank in job.ranks:
        if len(sockets) >= ASK_AT_MOST:
            break
        try:
            sockets.append((rank, locate_socket(rank.pid, log)))
        except ProbingError:
            continue
    if not sockets:
        return None, NO_LOCAL_AGENT
    deadline = time.monotonic() + timeout
    answers: queue.Queue[Tuple[Rank, Any]] = queue.Queue()

    def ask(rank: Rank, path: str) -> None:
        answer: Any = ProbingError("its agent gave no registry")
        try:
            with Client(path, _left(deadline), log, pid=rank.pid) as client:
                answer, _ = client.call("endpoints", {}, timeout=_left(deadline))
        except ProbingError as error:
            answer = error
        finally:
            answers.put((rank, answer))

    for rank, path in sockets:
        threading.Thread(target=ask, args=(rank, path), name="probing-ask-registry", daemon=True).start()
    why: Optional[str] = None
    for _ in sockets:
        try:
            rank, answer = answers.get(timeout=_left(deadline, JOIN_SLACK_S))
        except queue.Empty:
            break  # the others are still waiting on the store: what failed first says why
        if isinstance(answer, ProbingError):
            log(f"rank {rank.rank}: no registry of endpoints: {answer.message}")
            why = f"{UNREADABLE_REGISTRY} ({answer.message})"
            continue
        return answer, NOT_LISTENING
    return None, why or f"{UNREADABLE_REGISTRY} (no agent of this node gave it within {timeout:g} s)"


def _left(deadline: float, slack: float = 0.0) -> float:
    """Seconds left before `deadline` (+ `slack`), never quite 0: a timeout of 0 would block."""
    return max(0.001, deadline + slack - time.monotonic())


def with_remote_ranks(job: Job, timeout: float, log: Callable[[str], None]) -> Job:
    """`job` with its ranks on other nodes, when it has any (world size above this node's ranks)."""
    if job.world_size <= len(job.ranks) + len(job.absent):
        return job
    registry, why = ask_registry(job, timeout, log)
    return merge_registry(job, registry, why)


# --- --endpoints -------------------------------------------------------------------------------


def parse_endpoints(text: str) -> List[str]:
    """tcp:// URLs of `--endpoints HOST:PORT,...` or `--endpoints @FILE` (one per line, # comments)."""
    if text.startswith("@"):
        try:
            with open(text[1:], "rb") as handle:
                data = handle.read(MAX_ENDPOINTS_FILE_BYTES + 1)
        except OSError as error:
            raise UsageError(f"--endpoints: cannot read {text[1:]}: {error.strerror or error}") from None
        if len(data) > MAX_ENDPOINTS_FILE_BYTES:
            raise UsageError(f"--endpoints: {text[1:]} is larger than {MAX_ENDPOINTS_FILE_BYTES} bytes")
        lines = data.decode("utf-8", "replace").splitlines()
        words = [line.split("#", 1)[0].strip() for line in lines]
    else:
        words = [word.strip() for word in text.split(",")]
    urls = list(dict.fromkeys(endpoint_url(*split_endpoint(word)) for word in words if word))
    if not urls:
        raise UsageError("--endpoints names no endpoint: HOST:PORT,... or @FILE")
    if len(urls) > MAX_ENDPOINTS:
        raise UsageError(f"--endpoints: more than {MAX_ENDPOINTS} endpoints")
    return urls


def rank_from_hello(url: str, info: Dict[str, Any]) -> Rank:
    """The Rank an agent's hello describes (its run id and world size with it); UsageError for an
    agent that is no rank of a distributed job."""
    described = info.get("rank")
    fields = described if isinstance(described, dict) else {}
    rank, world_size = _integer(fields.get("rank")), _integer(fields.get("world_size"), 1)
    if rank is None or world_size is None or rank >= world_size:
        raise UsageError(
            f"{url} is no rank of a distributed job (its agent knows no RANK and WORLD_SIZE: "
            "--endpoints needs them in each process's environment)"
        )
    local_rank, node = _integer(fields.get("local_rank")), _integer(fields.get("group_rank"))
    pid = _integer(info.get("pid"), 1, 1 << 31) or 0
    endpoint = url[len(SCHEME) :]
    return Rank(rank, rank if local_rank is None else local_rank, 0 if node is None else node, pid,
                endpoint, _text(info.get("node")), remote=True, run_id=_text(fields.get("run_id")),
                world_size=world_size)  # fmt: skip


def one_job(found: Dict[str, Rank]) -> Tuple[Optional[str], int]:
    """The run id and world size every endpoint answered with; UsageError naming them when the
    endpoints are ranks of more than one job, or two of them the same rank."""
    jobs: Dict[Tuple[Optional[str], Optional[int]], str] = {}
    for url, rank in found.items():
        jobs.setdefault((rank.run_id, rank.world_size), url)
    if len(jobs) > 1:
        named = "; ".join(
            f"{url}: {'run ' + run if run is not None else 'no run id'}, world size {size}"
            for (run, size), url in list(jobs.items())[:4]
        )
        raise UsageError(f"--endpoints name ranks of more than one job ({named}): give one job's endpoints")
    by_rank: Dict[int, str] = {}
    for url, rank in found.items():
        other = by_rank.setdefault(rank.rank, url)
        if other != url:
            raise UsageError(f"--endpoints: {other} and {url} both answered as rank {rank.rank}")
    (run_id, world_size), _ = jobs.popitem()
    return run_id, world_size or 0


def job_from_endpoints(urls: List[str], timeout: float, log: Callable[[str], None]) -> Job:
    """The job the agents at `urls` are ranks of, each asked its hello in parallel, all within
    `timeout` (connection, handshake and hello). Every rank is reached over TCP, even one on this
    node. The endpoints must be ranks of one job (one run id, one world size). Ranks of the world
    that no endpoint answered for are unreachable, with the endpoints that did not answer named."""
    answers: Dict[str, Any] = {}
    deadline = time.monotonic() + timeout

    def hello(url: str) -> None:
        try:
            with Client(url, _left(deadline), log) as client:
                client.call("ping", timeout=_left(deadline))
                answers[url] = rank_from_hello(url, client.info)
        except ProbingError as error:
            answers[url] = error

    threads = [threading.Thread(target=hello, args=(url,), daemon=True) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(_left(deadline, JOIN_SLACK_S))
    found: Dict[str, Rank] = {}
    failed: List[Tuple[str, ProbingError]] = []
    for url in urls:
        answer = answers.get(url)
        if isinstance(answer, Rank):
            found[url] = answer
        else:
            late = AgentTimeout(f"{url} did not answer within {timeout:g} s")
            failed.append((url, answer if isinstance(answer, ProbingError) else late))
    if not found:
        raise failed[0][1]
    run_id, world_size = one_job(found)
    why = "no endpoint given answered for it"
    if failed:
        why += " (no answer from " + "; ".join(f"{url}: {error.message}" for url, error in failed[:4]) + ")"
    ranks = sorted(found.values())
    numbers = {rank.rank for rank in ranks}
    remote = ranks + [
        Rank(rank, rank, 0, 0, unreachable=why)
        for rank in range(min(world_size, MAX_WORLD))
        if rank not in numbers
    ]
    notes = [f"{url}: {error.message}" for url, error in failed]
    return Job(run_id, None, None, world_size, [], [], sorted(remote), notes)
