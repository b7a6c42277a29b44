"""`probing list`: the Python processes this user can see, and which have an agent."""

from __future__ import annotations

import os
from typing import List, NamedTuple, Optional

from ..client.discovery import agent_listens, python_version_of
from ..errors import ProbingError
from ..procfs import socket_candidates


class PythonProcess(NamedTuple):
    pid: int
    user: Optional[str]
    python_version: Optional[str]
    agent: bool
    command: str


def python_processes() -> List[PythonProcess]:
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "username", "cmdline", "name"]):
        info = process.info
        pid = info["pid"]
        if pid == os.getpid():
            continue
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
        agent = any(os.path.exists(path) and agent_listens(path) for path in socket_candidates(pid))
        command = " ".join(info.get("cmdline") or []) or f"[{info.get('name')}]"
        found.append(PythonProcess(pid, info.get("username"), version, agent, command))
    return found
