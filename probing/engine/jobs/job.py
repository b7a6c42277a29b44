"""A distributed job found from any one of its processes, and the ranks a command is given.

torchrun (and torch.distributed.launch, and most launchers after them) tells every rank who it
is in its environment: RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK (the node), MASTER_ADDR/PORT
(the rendezvous) and, under torchrun, TORCHELASTIC_RUN_ID. That start-up environment, read
from /proc, is what finds a job: no agent is needed, and a job that planned nothing for
probing is found as well as one that did.

The ranks of one job are the processes started by one launcher (torchrun's elastic agent, the
parent of every rank on its node) that carry the same run id and rendezvous: two jobs on one
machine never mix, even when both use torchrun's default run id ("none"). A DataLoader worker
inherits its rank's environment; it is taken for its rank.
"""

from __future__ import annotations

from ...analysis.rank_ranges import rank_numbers
from ...errors import ProbingError, UsageError
from ...procfs import environ_values, parent_pid, parents, process_alive, start_time

# No typing at run time: `probing PID backtrace --ranks all` starts through here (cli/fast.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Set, Tuple

    # (parent PID, run id, rendezvous): what one job's ranks share.
    JobKey = Tuple[Optional[int], Optional[str], Optional[str]]

VARIABLES = (
    "TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip
NOT_A_JOB_HINT = (
    "`ranks` and --ranks work on a rank of a distributed job (torchrun sets RANK and WORLD_SIZE in each "
    "rank's environment), or on the torchrun process that started them; `probing list` shows jobs"
)


class NotAJob(ProbingError):
    """The process is not part of a distributed job this machine can see."""


class Rank:
    """One process of the job: its global rank, its rank on its node, the node (torchrun's
    GROUP_RANK) and its PID (0: a rank of this node whose process is gone, `Job.absent`).
    Ordered by rank.

    A rank on another node (`remote`) is reached only through its agent's TCP `endpoint`
    ("HOST:PORT"); its PID is the one on its own node (`host`), for people to read. A rank
    reachable neither here nor over TCP has pid 0 and `unreachable` saying why.

    `run_id` and `world_size`: the job's, as this side knows them, for a remote rank: what
    answers on its endpoint must say it is this rank of this job (`identity_mismatch`).
    `relay`: the NodeRelay its requests go through, when its node has one (relayed.py)."""

    __slots__ = ("rank", "local_rank", "node", "pid", "endpoint", "host", "remote", "unreachable",
                 "run_id", "world_size", "relay")  # fmt: skip

    def __init__(
        self,
        rank: int,
        local_rank: int,
        node: int,
        pid: int,
        endpoint: Optional[str] = None,
        host: Optional[str] = None,
        remote: bool = False,
        unreachable: Optional[str] = None,
        run_id: Optional[str] = None,
        world_size: Optional[int] = None,
    ) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.node = node
        self.pid = pid
        self.endpoint = endpoint  # where its agent listens on TCP, when it does
        self.host = host  # the hostname of its node, when known
        self.remote = remote
        self.unreachable = unreachable
        self.run_id = run_id
        self.world_size = world_size
        self.relay: Any = None

    def _key(self) -> Tuple[int, int, int, int, str, str, bool, str, str, int]:
        return (self.rank, self.local_rank, self.node, self.pid, self.endpoint or "", self.host or "",
                self.remote, self.unreachable or "", self.run_id or "", self.world_size or 0)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rank) and self._key() == other._key()

    def __lt__(self, other: Rank) -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        where = f", endpoint={self.endpoint!r}" if self.endpoint else ""
        return (
            f"Rank(rank={self.rank}, local_rank={self.local_rank}, node={self.node}, pid={self.pid}{where})"
        )


class NotTheRank(ProbingError):
    """What answers on a rank's endpoint is not that rank of that job."""


STALE_ENDPOINT_HINT = (
    "its agent is gone and the port is another's now (a rank restarted, or another job): "
    "`probing PID ranks` on the rank's node shows where it listens"
)


def _number(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _who(rank: Optional[int], run: Optional[str], world: Optional[int], pid: Optional[int]) -> str:
    text = "no rank of a distributed job" if rank is None else f"rank {rank}"
    text += f" of run {run:.80}" if run is not None else ""
    details = [f"world size {world}"] if world is not None else []
    details += [f"PID {pid}"] if pid is not None else []
    return text + (f" ({', '.join(details)})" if details else "")


def identity_mismatch(rank: Rank, url: str, info: Dict[str, Any]) -> Optional[str]:
    """Why the agent whose hello is `info`, reached at `url`, is not `rank` (None when it is).
    Its rank must match; its run id, world size and PID too wherever both sides know them."""
    described = info.get("rank")
    fields: Dict[str, Any] = described if isinstance(described, dict) else {}
    number, world = _number(fields.get("rank")), _number(fields.get("world_size"))
    pid = _number(info.get("pid"))
    run = fields.get("run_id") if isinstance(fields.get("run_id"), str) else None
    runs = run is not None and rank.run_id is not None and run != rank.run_id
    worlds = world is not None and rank.world_size is not None and world != rank.world_size
    pids = pid is not None and rank.pid != 0 and pid != rank.pid
    if number == rank.rank and not (runs or worlds or pids):
        return None
    answered = _who(number, run if runs else None, world if worlds else None, pid if pids else None)
    expected = _who(rank.rank, rank.run_id if runs else None, rank.world_size if worlds else None,
                    rank.pid if pids else None)  # fmt: skip
    return f"{url} answered as {answered}, not {expected}: a stale registry entry?"


class Job:
    """The ranks of one job found on this machine, and what names the job."""

    __slots__ = ("run_id", "launcher", "master", "world_size", "ranks", "absent", "remote", "notes")

    def __init__(
        self,
        run_id: Optional[str],
        launcher: Optional[int],
        master: Optional[str],
        world_size: int,
        ranks: List[Rank],
        absent: Optional[List[Rank]] = None,
        remote: Optional[List[Rank]] = None,
        notes: Optional[List[str]] = None,
    ) -> None:
        self.run_id = run_id  # TORCHELASTIC_RUN_ID; None when not started by torchrun
        self.launcher = launcher  # the PID that started the ranks (torchrun's elastic agent)
        self.master = master  # MASTER_ADDR:MASTER_PORT, the job's rendezvous
        self.world_size = world_size
        self.ranks = ranks  # the ranks found on this machine, by rank
        # Ranks this machine should have (LOCAL_WORLD_SIZE of them) whose process is gone, pid 0.
        self.absent = absent or []
        # Ranks of other nodes: reached over TCP (remote), or not at all (unreachable set).
        self.remote = remote or []
        self.notes = notes or []  # how the other nodes' ranks were looked for, when it failed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and all(
            getattr(self, name) == getattr(other, name) for name in self.__slots__
        )

    def __repr__(self) -> str:
        return f"Job({self.name()}, world size {self.world_size}, ranks {self.ranks})"

    def name(self) -> str:
        """How a person reads which job this is."""
        parts = []
        if self.run_id is not None:
            parts.append(f"run {self.run_id}")
        if self.launcher is not None:
            parts.append(f"torchrun PID {self.launcher}")
        if self.master is not None:
            parts.append(f"rendezvous {self.master}")
        return ", ".join(parts) or "distributed job"


class _Found:
    """A process found to be a rank: which job (its key) and which rank."""

    __slots__ = ("key", "rank", "world_size", "local_world_size")

    def __init__(self, key: JobKey, rank: Rank, world_size: int, local_world_size: Optional[int]) -> None:
        self.key = key
        self.rank = rank
        self.world_size = world_size
        self.local_world_size = local_world_size


def _integer(value: Optional[str]) -> Optional[int]:
    # The environment is the job's: any text may be there.
    try:
        return int(value) if value is not None and len(value) < 12 else None
    except ValueError:
        return None


def _rank_of(pid: int) -> Optional[_Found]:
    """The rank `pid` is, from its start-up environment; None when it is not a rank (or the
    environment cannot be read)."""
    variables = environ_values(pid, VARIABLES)
    if not variables:
        return None
    rank, world_size = _integer(variables.get("RANK")), _integer(variables.get("WORLD_SIZE"))
    if rank is None or world_size is None or not 0 <= rank < world_size:
        return None
    local_rank = _integer(variables.get("LOCAL_RANK"))
    node = _integer(variables.get("GROUP_RANK"))
    address, port = variables.get("MASTER_ADDR"), variables.get("MASTER_PORT")
    master = f"{address}:{port}" if address and port else None
    key = (parent_pid(pid), variables.get("TORCHELASTIC_RUN_ID"), master)
    local = local_rank if local_rank is not None else rank
    local_world_size = _integer(variables.get("LOCAL_WORLD_SIZE"))
    return _Found(key, Rank(rank, local, node if node is not None else 0, pid), world_size, local_world_size)


def _topmost(pid: int, found: _Found) -> Tuple[int, _Found]:
    """The rank process itself when `pid` is one of its descendants (a DataLoader worker
    inherits its environment): the highest ancestor with the same rank and job."""
    while True:
        parent = found.key[0]
        above = _rank_of(parent) if parent else None
        if above is None or above.rank.rank != found.rank.rank or above.key[1:] != found.key[1:]:
            return pid, found
        pid, found = parent or 0, above


def rank_of(pid: int) -> Optional[Tuple[JobKey, Rank]]:
    """The job (its key) and the rank `pid` is; a DataLoader worker is taken for its rank, whose
    own PID the Rank carries. None for a process outside a job. Reads /proc only: cheap enough
    for every process `probing list` shows."""
    found = _rank_of(pid)
    if found is None:
        return None
    _, found = _topmost(pid, found)
    return found.key, found.rank


def _children(pid: int, recursive: bool) -> List[int]:
    """Children of `pid` (all its descendants when `recursive`), parents before children."""
    by_parent: Dict[int, List[int]] = {}
    for child, parent in parents().items():
        by_parent.setdefault(parent, []).append(child)
    found = sorted(by_parent.get(pid, []))
    index = 0
    while recursive and index < len(found):
        found.extend(sorted(by_parent.get(found[index], [])))
        index += 1
    return found


def _ranks_under(launcher: int, key: JobKey) -> List[_Found]:
    found = []
    for child in _children(launcher, recursive=False):
        each = _rank_of(child)
        if each is not None and each.key == key and process_alive(child):
            found.append(each)
    return found


def _job(key: JobKey, ranks: List[_Found]) -> Job:
    by_rank: Dict[int, Rank] = {}
    # A rank's older process left over from a restart loses to the newest.
    for each in sorted(ranks, key=lambda each: -(start_time(each.rank.pid) or 0.0)):
        by_rank.setdefault(each.rank.rank, each.rank)
    world_size = max(each.world_size for each in ranks)
    present = sorted(by_rank.values())
    return Job(key[1], key[0], key[2], world_size, present, _absent(ranks, present))


def _absent(found: List[_Found], present: List[Rank]) -> List[Rank]:
    """Local ranks of this node that no live process has. Their global rank is the one torchrun
    gives on nodes of equal size (node * LOCAL_WORLD_SIZE + local rank)."""
    sizes = {each.local_world_size for each in found}
    if len(sizes) != 1 or None in sizes:
        return []
    size = sizes.pop() or 0
    node = present[0].node
    here = {rank.local_rank for rank in present}
    return [
        Rank(node * size + local, local, node, 0) for local in range(min(size, 4096)) if local not in here
    ]


def find_job(pid: int) -> Job:
    """The job `pid` belongs to: `pid` is a rank (or a process under one), or the launcher
    that started the ranks (or a process above it, such as a shell script)."""
    found = _rank_of(pid)
    if found is not None:
        pid, found = _topmost(pid, found)
        launcher = found.key[0]
        ranks = _ranks_under(launcher, found.key) if launcher else []
        return _job(found.key, ranks or [found])
    jobs: Dict[JobKey, List[_Found]] = {}
    for child in _children(pid, recursive=True):
        each = _rank_of(child)
        if each is None or not process_alive(child):
            continue
        top, each = _topmost(child, each)
        if top == child:
            jobs.setdefault(each.key, []).append(each)
    if not jobs:
        raise NotAJob(
            f"PID {pid} is not part of a distributed job: neither it nor a process under it has "
            "RANK and WORLD_SIZE in its environment",
            hint=NOT_A_JOB_HINT,
        )
    if len(jobs) > 1:
        names = "; ".join(
            f"{_job(key, ranks).name()} (rank PIDs {', '.join(str(each.rank.pid) for each in ranks)})"
            for key, ranks in jobs.items()
        )
        raise UsageError(f"more than one distributed job runs under PID {pid}: {names}; give one of its PIDs")
    key, ranks = next(iter(jobs.items()))
    return _job(key, ranks)


def parse_ranks(text: str) -> Optional[Set[int]]:
    """--ranks: None for `all`, else the ranks of a list such as `0,2-3`."""
    if text.strip() == "all":
        return None
    chosen: Set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise UsageError(f"--ranks takes `all` or a list such as 0,2-3, not {text!r}") from None
        if low < 0 or high < low or high - low > 1 << 20:
            raise UsageError(f"--ranks: {part.strip()!r} is not a range of ranks")
        chosen.update(range(low, high + 1))
    return chosen


def choose(job: Job, text: str) -> List[Rank]:
    """The ranks of `job` that --ranks names; a rank the job has not here is a usage error. A
    rank whose process is gone is chosen too (pid 0): the answer says it is missing."""
    wanted = parse_ranks(text)
    if wanted is None:
        return sorted(job.ranks + job.absent + job.remote)
    here = {rank.rank: rank for rank in job.ranks + job.absent + job.remote}
    absent = sorted(wanted - set(here))
    if absent:
        listed = rank_numbers(list(here)) or "none"
        raise UsageError(
            f"--ranks {text}: no rank {', '.join(map(str, absent[:8]))} in {job.name()} "
            f"(ranks here: {listed}; world size {job.world_size})"
        )
    return [here[rank] for rank in sorted(wanted)]
