"""`probing PID record`: ask a live job's agent to write a record now, without stopping it."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

from ..errors import BadReply
from .target import Target

# Beyond --timeout: a record holding a million-row torch_trace takes the agent about a second.
RECORD_WRITE_S = 30.0


def request_record(target: Target, reason: Optional[str], timeout: float) -> Dict[str, Any]:
    """What the agent wrote: path, bytes, seconds (its own time), tables, notes; and `pid`,
    and `waited` (the seconds this side waited, the connection included)."""
    started = time.monotonic()
    params: Dict[str, Any] = {"kind": "on_demand"}
    if reason:
        params["reason"] = reason
    with target.connect(timeout) as client:
        result, _ = client.call("record", params, timeout=timeout + RECORD_WRITE_S)
        pid = target.pid or client.info.get("pid")
    if not isinstance(result.get("path"), str):
        raise BadReply("the agent's answer to 'record' names no file")
    return dict(result, pid=pid, waited=time.monotonic() - started)
