"""The header of a record (records-contract.md): who the process is, when, and why."""

from __future__ import annotations

import os
import socket
import sys
from types import ModuleType
from typing import Any, Dict, List, Optional

from ... import __version__
from ...procfs import process_start_time
from ..identity import python_version, working_directory
from ..imported import imported
from ..listener.rank import rank_identity
from ..stacks import thread_name
from ..threads import job_thread
from .trigger import Trigger


def header(trigger: Trigger, notes: List[str], written_at: float) -> Dict[str, Any]:
    error = trigger.error
    # Never threading.current_thread(): in an agent thread it would register a _DummyThread.
    thread = trigger.thread if trigger.thread is not None else job_thread()
    rank = rank_identity()
    hostname = socket.gethostname()
    return {
        "probing_version": __version__,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "uid": os.geteuid(),
        "hostname": hostname,
        "argv": list(sys.argv),
        "cwd": working_directory(),
        "executable": sys.executable,
        "python_version": python_version(),
        "torch_version": torch_version(),
        "started_at": process_start_time(),
        "written_at": written_at,
        "reason": {
            "kind": trigger.kind,
            "message": trigger.message,
            "signal": trigger.signum,
            "exit_status": trigger.status,
        },
        "exception": _described(error, thread_name(thread) or "a thread without a name"),
        "rank": None
        if rank is None
        else {
            "rank": rank.get("rank"),
            "local_rank": rank.get("local_rank"),
            "world_size": rank.get("world_size"),
            "node": hostname,
            "run_id": rank.get("run_id"),
        },  # fmt: skip
        "tables": [],
        "notes": notes,
        "write_seconds": 0.0,
    }


def torch_version() -> Optional[str]:
    """torch's version when the job imported it, read from the module's own dict (no attribute
    hook of the job's runs), as a plain str."""
    torch = imported("torch")
    if type(torch) is not ModuleType:  # a subclass (a lazy module) could run code on any lookup
        return None
    version = vars(torch).get("__version__")
    return str.__str__(version)[:64] if isinstance(version, str) else None


def _described(error: Any, thread_name: str) -> Any:
    if error is None:
        return None
    from .classify import describe  # only when a job dies: it imports traceback

    return describe(error, thread_name)
