"""Requests `{id, method, params}`, replies `{id, ok: true, result}` or
`{id, ok: false, error: {type, message, ...}}`, and the kinds of error an agent replies with.

Runs inside the target: standard library only, Python 3.8 syntax.
"""

from __future__ import annotations

from .frames import FrameError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Tuple

PROTOCOL_VERSION = 1


class ErrorKind:
    """The `type` of an error reply: every kind an agent sends. The client maps each one to a
    ProbingError (client/replies.py, `error_from_reply`); a kind it does not know (a newer
    agent) becomes a generic error with the agent's message.

    String constants rather than an Enum: `probing PID backtrace` must not import enum
    (tests/integration/test_startup.py), and the values are what travels on the wire.
    """

    BAD_REQUEST = "BadRequest"  # parameters the method cannot take
    BAD_FRAME = "BadFrame"  # a frame that is not a request at all
    UNKNOWN_METHOD = "UnknownMethod"
    PROTOCOL_MISMATCH = "ProtocolMismatch"  # the client speaks another protocol version
    TIMEOUT = "Timeout"  # the client sent no whole request in time; the agent hangs up
    PERMISSION_DENIED = "PermissionDenied"  # the peer's uid may not talk to this agent
    BUSY = "Busy"  # every connection runs a request, or another growth window runs
    NOT_FOUND = "NotFound"  # no such table, thread or frame
    CANCELLED = "Cancelled"  # a long request ended early: the client left or the agent stopped
    REPLY_TOO_LARGE = "ReplyTooLarge"
    INTERNAL_ERROR = "InternalError"  # a bug in the agent
    NO_TORCH = "NoTorch"
    NO_CUDA = "NoCuda"
    REMOTE_ERROR = "RemoteError"  # the job's code run by eval or repl raised
    EVAL_TIMEOUT = "EvalTimeout"
    NO_SESSION = "NoSession"  # the repl session is gone
    STATEMENT_RUNNING = "StatementRunning"  # the repl session still runs a statement
    RECORD_NOT_WRITTEN = "RecordNotWritten"  # `record`: the disk is full, the directory refused...
    NO_GIL = "NoGil"  # a free-threaded job with the GIL off: reading its threads is refused (agent/gil.py)

    ALL = (
        BAD_REQUEST, BAD_FRAME, UNKNOWN_METHOD, PROTOCOL_MISMATCH, TIMEOUT, PERMISSION_DENIED, BUSY,
        NOT_FOUND, CANCELLED, REPLY_TOO_LARGE, INTERNAL_ERROR, NO_TORCH, NO_CUDA, REMOTE_ERROR,
        EVAL_TIMEOUT, NO_SESSION, STATEMENT_RUNNING, RECORD_NOT_WRITTEN, NO_GIL,
    )  # fmt: skip


def parse_request(header: Dict[str, Any]) -> Tuple[Any, str, Dict[str, Any]]:
    """Check a request header against the schema; returns (id, method, params)."""
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, (int, str)):
        raise FrameError("request 'id' must be an integer or a string", fatal=False)
    method = header.get("method")
    if not isinstance(method, str) or not method:
        raise FrameError("request has no 'method' string", fatal=False, request_id=request_id)
    params = header.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise FrameError("request 'params' must be an object", fatal=False, request_id=request_id)
    return request_id, method, params


def request(request_id: Any, method: str, params: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return {"id": request_id, "method": method, "params": params or {}}


def ok_reply(request_id: Any, result: Any) -> Dict[str, Any]:
    return {"id": request_id, "ok": True, "result": result}


def error_reply(request_id: Any, error_type: str, message: str, **details: Any) -> Dict[str, Any]:
    """An error reply; `error_type` is one of ErrorKind."""
    error = {"type": error_type, "message": message}
    error.update(details)
    return {"id": request_id, "ok": False, "error": error}


def parse_reply(header: Dict[str, Any]) -> Tuple[Any, bool, Any]:
    """Check a reply header against the schema; returns (id, ok, result-or-error)."""
    ok = header.get("ok")
    if not isinstance(ok, bool):
        raise FrameError("reply has no boolean 'ok'", fatal=False)
    if ok:
        return header.get("id"), True, header.get("result")
    error = header.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        raise FrameError("error reply has no 'error.message'", fatal=False)
    error.setdefault("type", "Error")
    return header.get("id"), False, error
