"""`probing list`: the Python processes this user can see, which have an agent, and which
distributed job and rank each belongs to.

Fast by design: /proc and a connect to each agent's socket, never an attach or a py-spy look.
A job's processes are found from their start-up environment (engine/jobs/job.py), and listed
together: its launcher (torchrun), then its ranks in rank order, each rank's DataLoader
workers after it.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Tuple

from ..client.discovery import agent_listens, python_version_of, socket_candidates
from ..errors import ProbingError
from ..procfs import process_alive
from .jobs.job import rank_of

if TYPE_CHECKING:
    from .jobs.job import JobKey

# torchrun --standalone makes up a run id (a UUID); its first 8 characters tell jobs apart.
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class PythonProcess(NamedTuple):
    pid: int
    user: Optional[str]
    python_version: Optional[str]
    agent: Optional[bool]  # None: this user cannot tell (agent_state)
    job: Optional[str]  # a short name of its distributed job (job_names); None outside one
    rank: Optional[int]  # the rank it is (or works for: a DataLoader worker)
    local_rank: Optional[int]
    command: str


def agent_present(pid: int) -> bool:
    """Whether an agent accepts connections on the socket of `pid` (connects, says nothing;
    never attaches)."""
    return agent_state(pid) is True


def agent_state(pid: int) -> Optional[bool]:
    """True when an agent accepts connections on the socket of `pid`, False when none does, and
    None when this user cannot tell: the socket would be in a directory it may not search (a root
    job's /tmp/probing-0, mode 0700, seen by nobody), or the job's environment, which may name
    another directory (PROBING_SOCKET_DIR), is another user's to read."""
    unknown = _environment_hidden(pid)
    for path in socket_candidates(pid):
        try:
            os.stat(path)
        except PermissionError:
            unknown = True
            continue
        except OSError:
            continue
        if agent_listens(path):
            return True
    return None if unknown else False


def _environment_hidden(pid: int) -> bool:
    """Whether the process's environment is another user's (a process gone or exited is not)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environment:
            environment.read(1)
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def is_probing_cli(argv: List[str]) -> bool:
    """Whether a command line is one of probing's own (`probing ...` runs the Python CLI as
    `PYTHON .../probing-python ARGS`; `python -m probing ARGS`): probing at work, not a job."""
    for index, word in enumerate(argv[1:], 1):
        if word == "-m":
            return argv[index + 1 : index + 2] == ["probing"]
        if not word.startswith("-"):  # the script: the first word that is no option of Python's
            return os.path.basename(word) == "probing-python"
    return False


def job_names(keys: List[JobKey]) -> Dict[JobKey, str]:
    """A short name for each job: its run id (a generated UUID cut to 8 characters), or
    `torchrun PID` where there is none, torchrun's default (`none`), or one that another job
    listed shares: two jobs never show under one name."""
    proposed: Dict[JobKey, str] = {}
    for key in keys:
        launcher, run_id, _ = key
        if run_id and run_id != "none":
            proposed[key] = run_id[:8] if _UUID.match(run_id) else run_id
    taken = list(proposed.values())
    names = {}
    for key in keys:
        name = proposed.get(key)
        if name is None or taken.count(name) > 1:
            name = f"torchrun {key[0]}" if key[0] is not None else "distributed job"
        names[key] = name
    return names


def _order(process: PythonProcess, launched: Dict[int, int]) -> Tuple[int, int, int]:
    """A job's launcher, then its ranks in rank order (each rank's workers after it), where
    the launcher's PID puts them; every other process by PID."""
    anchor = launched.get(process.pid, process.pid)
    return (anchor, -1 if process.rank is None else process.rank, process.pid)


def python_processes() -> List[PythonProcess]:
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "username", "cmdline", "name"]):
        info = process.info
        pid = info["pid"]
        if pid == os.getpid() or not process_alive(pid):
            continue  # a process that has exited (a zombie not yet reaped) has nothing to debug
        try:
            version = python_version_of(pid)
        except ProbingError:
            # Another user's process: /proc hides its executable, its name still shows.
            name = info.get("name") or ""
            if not name.startswith("python"):
                continue
            version = None
        if version is None and not (info.get("name") or "").startswith("python"):
            continue
        argv = info.get("cmdline") or []
        if is_probing_cli(argv):
            continue
        command = " ".join(argv) or f"[{info.get('name')}]"
        found.append(
            PythonProcess(pid, info.get("username"), version, agent_state(pid), None, None, None, command)
        )
    return _with_jobs(found)


def _with_jobs(processes: List[PythonProcess]) -> List[PythonProcess]:
    """Each process with its job and rank, sorted so that a job's processes come together."""
    members = {process.pid: rank_of(process.pid) for process in processes}
    keys = list(dict.fromkeys(member[0] for member in members.values() if member is not None))
    names = job_names(keys)
    launchers = {key[0]: names[key] for key in keys if key[0] is not None}
    launched: Dict[int, int] = {}  # PID -> the PID of the launcher its job is listed under
    listed = []
    for process in processes:
        member = members[process.pid]
        if member is not None:
            key, rank = member
            process = process._replace(job=names[key], rank=rank.rank, local_rank=rank.local_rank)
            if key[0] is not None:
                launched[process.pid] = key[0]
        elif process.pid in launchers:
            process = process._replace(job=launchers[process.pid])
        listed.append(process)
    return sorted(listed, key=lambda process: _order(process, launched))
