"""`probing PID record`: ask a live job's agent to write a record now, without stopping it."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

from ...errors import BadReply, RecordNotWritten
from ..target import Target
from .fields import integer, is_texts, number

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
        try:
            result, _ = client.call("record", params, timeout=timeout + RECORD_WRITE_S)
        except RecordNotWritten as error:
            # The agent's words say why ("cannot write in DIR: No space left on device"); whose.
            pid = target.pid or client.info.get("pid")
            raise RecordNotWritten(f"PID {pid}: {error.message}") from None
        pid = target.pid or client.info.get("pid")
    check_recorded(result)
    return dict(result, pid=pid, waited=time.monotonic() - started)


def check_recorded(result: Dict[str, Any]) -> None:
    """The agent's answer to `record`, each field the CLI prints of the type it prints it as
    (BadReply otherwise): a hostile or older agent's answer is never a traceback."""
    if not isinstance(result.get("path"), str):
        raise BadReply("the agent's answer to 'record' names no file")
    size, seconds = result.get("bytes"), result.get("seconds")
    if size is not None and (integer(size) is None or size < 0):
        raise BadReply(f"the agent's answer to 'record' has bytes {size!r}, not a count of bytes")
    if seconds is not None and number(seconds) is None:
        raise BadReply(f"the agent's answer to 'record' has seconds {seconds!r}, not a number")
    for key in ("tables", "notes", "failures"):
        if result.get(key) is not None and not is_texts(result[key]):
            raise BadReply(f"the agent's answer to 'record' has {key} that are not a list of strings")
