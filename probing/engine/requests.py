"""The other requests to one target's agent: eval, memory, trace/nan switches, inject, detach.
Each returns what the agent answered, with the PID as this side sees it."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, NamedTuple, Optional, Tuple

from ..client.replies import decode_reply_texts
from ..errors import NoAgent
from .sources import SourceLines
from .target import Target

# Room left, beyond an eval's own timeout, for the agent to interrupt it and reply.
EVAL_REPLY_GRACE_S = 3.0


def evaluate(
    target: Target, code: str, frame: Optional[str], timeout: float, force: bool = False
) -> Dict[str, Any]:
    """Run `code` in the target; its output and value (as large as they came)."""
    with target.connect(min(timeout, 5.0)) as client:
        params: Dict[str, Any] = {"code": code, "frame": frame, "timeout": timeout}
        if force:
            params["allow_exit"] = True
        result, payload = client.call("eval", params, timeout=timeout + EVAL_REPLY_GRACE_S)
    return decode_reply_texts(result, payload)


class MemoryAnswer(NamedTuple):
    action: str  # summary, growth, interval or cuda_snapshot
    result: Dict[str, Any]  # what the agent answered, with "pid" (and "outside" for a summary)
    command: str  # the job's command line
    snapshot: bytes  # the CUDA allocator snapshot, for cuda_snapshot
    # For growth: the source line at each (file, line) its sites name, read as the job's user.
    code: Dict[Tuple[str, int], str] = {}


def memory(
    target: Target,
    growth: Optional[float],
    cuda_snapshot: bool,
    interval: Optional[float],
    top: int,
    timeout: float,
    scan_budget: float,
) -> MemoryAnswer:
    params: Dict[str, Any] = {"top": top, "scan_budget_s": scan_budget}
    wait = timeout + scan_budget
    if growth is not None:
        params.update(action="growth", seconds=growth)
        wait = growth + 2 * scan_budget + timeout  # the window, two object scans, the rest
    elif cuda_snapshot:
        params["action"] = "cuda_snapshot"
    elif interval is not None:
        params.update(action="interval", interval_s=interval)
    else:
        params["action"] = "summary"
    pid = target.pid
    with target.connect(min(timeout, 10.0)) as client:
        result, payload = client.call("memory", params, timeout=wait)
        pid = pid or client.info.get("pid")
        result["pid"] = pid
        command = " ".join(client.info.get("argv") or [])
    if params["action"] == "summary" and not target.remote:  # a remote PID is its own node's
        result["outside"] = outside_memory(int(pid or 0))
    code = {}
    if params["action"] == "growth":  # a remote PID is its own node's: read as nobody's here
        code = site_lines(result, SourceLines(None if target.remote or not pid else int(pid)))
    return MemoryAnswer(params["action"], result, command, bytes(payload), code)


def site_lines(result: Dict[str, Any], sources: SourceLines) -> Dict[Tuple[str, int], str]:
    """The source line of every place a growth report names (where the job's line led to an
    allocation, where a tensor was made); places the agent gave in another shape have none."""
    code = {}
    for site in [*(result.get("sites") or ()), *(result.get("tensor_sites") or ())]:
        if not isinstance(site, dict):
            continue
        for file, line in (
            (site.get("file"), site.get("line")),
            (site.get("job_file"), site.get("job_line")),
        ):
            if isinstance(file, str) and isinstance(line, int) and (file, line) not in code:
                code[file, line] = sources.line(file, line)
    return code


def outside_memory(pid: int) -> Dict[str, Any]:
    """USS, PSS and swap from /proc/PID/smaps (psutil): what the process alone holds."""
    import psutil

    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.Error, OSError) as error:
        return {"error": f"{type(error).__name__}: {error}"}
    mb = 1024.0 * 1024.0
    return {"uss_mb": info.uss / mb, "pss_mb": info.pss / mb, "swap_mb": info.swap / mb}


def switch(target: Target, feature: str, params: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """trace / nan: turn a torch feature of the agent on or off, or report on it. The agent's
    answer (status, hooks_before, hooks_after) with the PID."""
    with target.connect(timeout) as client:
        result, _ = client.call(feature, params)
        return dict(result, pid=client.info.get("pid"))


def inject(target: Target, method: str) -> Any:
    """Put the agent into the process now; how it went (attach.Attached)."""
    from ..attach import attach  # attaching's tools (pathlib, tracers: ~4 ms) load to attach alone

    pid = target.require_pid("inject")
    return attach(pid, method, target.attach_timeout, target.log)


def detach(target: Target, timeout: float) -> Any:
    """Stop the agent and wait until its socket is gone; the agent's PID."""
    try:
        client = target.connect_existing(timeout)
    except NoAgent as error:
        from ..attach.liveness import stopped_agent  # as attach, above

        if target.pid is None or stopped_agent(target.pid) is None:
            raise NoAgent(error.message, hint="there is nothing to detach") from None
        raise NoAgent(
            f"the agent in PID {target.pid} stopped listening: there is no agent to detach",
            hint=f"`probing {target.pid} inject` starts a new one, which detach then takes out with what "
            "the old one left (its hooks and stream routing)",
        ) from None
    with client:
        client.call("detach")
        pid, path = client.info.get("pid"), client.info.get("socket")
    # The agent stops right after its reply; wait until its socket is gone.
    deadline = time.monotonic() + timeout
    while path and os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return pid
