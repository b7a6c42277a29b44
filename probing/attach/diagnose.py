"""Why an agent did not come up: read from outside the process, with py-spy."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..processes import process_alive


def py_spy() -> Optional[str]:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def read_stacks(pid: int, timeout: float = 5.0) -> List[Dict[str, Any]]:
    """py-spy's view of every thread (JSON), or an empty list when it cannot read them."""
    binary = py_spy()
    if binary is None:
        return []
    try:
        result = subprocess.run(
            [binary, "dump", "--pid", str(pid), "--json"], capture_output=True, text=True, timeout=timeout
        )
        threads: List[Dict[str, Any]] = json.loads(result.stdout)
        return threads
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []


def describe_frame(frame: Dict[str, Any]) -> str:
    return f"{frame.get('name')} ({frame.get('short_filename') or frame.get('filename')}:{frame.get('line')})"


def why_no_agent(pid: int) -> str:
    if not process_alive(pid):
        return "the process exited"
    threads = read_stacks(pid)
    if not threads:
        return "its stacks could not be read from outside either (is py-spy installed?)"
    for thread in threads:
        if thread.get("owns_gil"):
            frames = thread.get("frames") or []
            where = f" in {describe_frame(frames[0])}" if frames else ""
            return (
                f"thread '{thread.get('thread_name') or thread.get('thread_id')}' (native id "
                f"{thread.get('os_thread_id')}) holds the GIL{where} and has not released it"
            )
    return "no thread holds the GIL, yet the agent's thread did not run (is the interpreter shutting down?)"
