"""Request dispatch: one function per method; any failure becomes an error reply."""

from __future__ import annotations

import os
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .. import __version__, protocol
from .tables import TABLES, python_version

if TYPE_CHECKING:
    Reply = Tuple[Dict[str, Any], List[protocol.ByteChunk]]


class RequestError(Exception):
    """A request that cannot be served; becomes `{ok: false, error: {type, message, ...}}`."""

    def __init__(self, error_type: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.details = details


def _hello(server: Any, params: Dict[str, Any]) -> Any:
    client_version = params.get("protocol")
    if client_version is not None and client_version != protocol.PROTOCOL_VERSION:
        raise RequestError(
            "ProtocolMismatch",
            f"the agent speaks protocol {protocol.PROTOCOL_VERSION}, the client {client_version}",
            protocol=protocol.PROTOCOL_VERSION,
        )
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    return {
        "protocol": protocol.PROTOCOL_VERSION,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "python_version": python_version(),
        "implementation": sys.implementation.name,
        "probing_version": __version__,
        "argv": list(sys.argv),
        "cwd": cwd,
        "executable": sys.executable,
        "socket": server.path,
        "capabilities": sorted(METHODS),
        "tables": sorted(TABLES),
    }


def _tables(server: Any, params: Dict[str, Any]) -> Any:
    return {"tables": [table.describe() for table in TABLES.values()]}


def _table(server: Any, params: Dict[str, Any]) -> Reply:
    name = params.get("name")
    table = TABLES.get(name) if isinstance(name, str) else None
    if table is None:
        raise RequestError("NotFound", f"no table {name!r}; tables: {', '.join(sorted(TABLES))}")
    descriptor, chunks = table.build(server, params).encode()
    return {"table": descriptor}, chunks


def _backtrace(server: Any, params: Dict[str, Any]) -> Reply:
    return _table(server, dict(params, name="python.backtrace"))


def _eval(server: Any, params: Dict[str, Any]) -> Any:
    from .evaluate import run_eval

    return run_eval(server.own_threads, params)


def _repl(server: Any, params: Dict[str, Any]) -> Any:
    from .repl import handle

    return handle(server.own_threads, params)


def _tracer(server: Any) -> Any:
    from . import torchtrace

    try:
        return torchtrace.tracer(server.own_threads)
    except torchtrace.NoTorch as error:
        raise RequestError("NoTorch", str(error)) from None


def _int_param(params: Dict[str, Any], name: str, low: int) -> Optional[int]:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RequestError("BadRequest", f"{name} must be an integer >= {low}, not {value!r}")
    return value


def _trace(server: Any, params: Dict[str, Any]) -> Any:
    action = params.get("action")
    if action not in ("on", "off", "status"):
        raise RequestError("BadRequest", f"trace action must be on, off or status, not {action!r}")
    tracer = _tracer(server)
    before = tracer.hook_count()
    if action == "on":
        patterns = params.get("modules")
        if patterns is not None and (
            not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns)
        ):
            raise RequestError("BadRequest", "modules must be a list of glob patterns")
        try:
            tracer.configure_trace(
                _int_param(params, "every", 1), bool(params.get("backward")), patterns or None,
                _int_param(params, "depth", 0), _int_param(params, "capacity", 1),
            )  # fmt: skip
        except ValueError as error:
            raise RequestError("BadRequest", str(error)) from None
    elif action == "off":
        tracer.trace_off()
    return {"status": tracer.status(), "hooks_before": before, "hooks_after": tracer.hook_count()}


def _nan(server: Any, params: Dict[str, Any]) -> Any:
    action = params.get("action")
    if action not in ("on", "off", "status"):
        raise RequestError("BadRequest", f"nan action must be on, off or status, not {action!r}")
    tracer = _tracer(server)
    before = tracer.hook_count()
    if action != "status":
        tracer.configure_nan(action == "on", bool(params.get("stop")))
    return {"status": tracer.status(), "hooks_before": before, "hooks_after": tracer.hook_count()}


def _float_param(params: Dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = params.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError("BadRequest", f"{name} must be a number from {low:g} to {high:g}, not {value!r}")
    return float(value)


def _memory(server: Any, params: Dict[str, Any]) -> Any:
    action = params.get("action") or "summary"
    budget = _float_param(params, "scan_budget_s", 1.0, 0.001, 3600.0)
    top = _int_param(params, "top", 1) or 20
    if action == "summary":
        from .memory import summary

        return summary(budget, top)
    if action == "growth":
        from .growth import watch
        from .server import client_gone

        return watch(_float_param(params, "seconds", 10.0, 0.01, 86400.0), budget, top, client_gone)
    if action == "interval":
        from .memory import MIN_INTERVAL_S, start_sampling

        interval = _float_param(params, "interval_s", 1.0, 0.0, 86400.0)
        if 0 < interval < MIN_INTERVAL_S:
            raise RequestError("BadRequest", f"interval_s must be 0 (off) or at least {MIN_INTERVAL_S:g} s")
        sampler = start_sampling(server.own_threads, interval)
        return {"sampler": sampler.status() if sampler is not None else None}
    if action == "cuda_snapshot":
        return _cuda_snapshot()
    raise RequestError(
        "BadRequest", f"memory action must be summary, growth, interval or cuda_snapshot, not {action!r}"
    )


def _cuda_snapshot() -> Reply:
    import pickle

    from .memory import cuda_module

    cuda = cuda_module()
    if cuda is None:
        imported = "torch" in sys.modules
        raise RequestError(
            "NoCuda" if imported else "NoTorch",
            "the process has not initialised CUDA" if imported else "the process has not imported torch",
        )
    snapshot = cuda.memory._snapshot()
    data = pickle.dumps(snapshot)
    segments = snapshot.get("segments", []) if isinstance(snapshot, dict) else []
    history = bool(isinstance(snapshot, dict) and any(snapshot.get("device_traces") or ())) or any(
        block.get("frames") for segment in segments for block in segment.get("blocks", ())
    )
    return {"bytes": len(data), "segments": len(segments), "has_history": history}, [data]


def _ping(server: Any, params: Dict[str, Any]) -> Any:
    return {"pong": True}


def _detach(server: Any, params: Dict[str, Any]) -> Any:
    # Stopping closes this very connection: it happens once the reply is out (server.py).
    server.stop_after_reply = True
    return {"detaching": True}


# Methods that return a payload say so by returning a (result, chunks) tuple.
METHODS: Dict[str, Callable[[Any, Dict[str, Any]], Any]] = {
    "hello": _hello,
    "ping": _ping,
    "tables": _tables,
    "table": _table,
    "backtrace": _backtrace,
    "eval": _eval,
    "repl": _repl,
    "trace": _trace,
    "nan": _nan,
    "memory": _memory,
    "detach": _detach,
}


class Dispatcher:
    """One per connection. After a failed hello nothing else is served on that connection:
    a client of another protocol version pipelines its first request behind the hello, and
    that request (an eval, say) must not run."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.refused: Optional[str] = None

    def handle(self, frame: protocol.Frame) -> Reply:
        try:
            request_id, method, params = protocol.parse_request(frame.header)
        except protocol.FrameError as error:
            return protocol.error_reply(error.request_id, "BadRequest", str(error)), []
        if self.refused is not None:
            return protocol.error_reply(request_id, "ProtocolMismatch", self.refused), []
        handler = METHODS.get(method)
        if handler is None:
            message = f"unknown method {method!r}; methods: {', '.join(sorted(METHODS))}"
            return protocol.error_reply(request_id, "UnknownMethod", message), []
        try:
            result = handler(self.server, params)
        except RequestError as error:
            if error.error_type == "ProtocolMismatch":
                self.refused = error.message
            return protocol.error_reply(request_id, error.error_type, error.message, **error.details), []
        except Exception as error:  # noqa: BLE001 - a failing handler must not kill the agent
            return protocol.error_reply(
                request_id, "InternalError", f"{type(error).__name__}: {error}",
                traceback=traceback.format_exc(),
            ), []  # fmt: skip
        if isinstance(result, tuple):
            return protocol.ok_reply(request_id, result[0]), result[1]
        return protocol.ok_reply(request_id, result), []

    def close(self) -> None:
        """The connection is gone (its client may have been killed): a repl statement it was
        waiting on must not run on, a `while True: pass` burning the job's CPU."""
        repl = sys.modules.get(__package__ + ".repl")
        if repl is not None:
            repl.connection_closed(threading.get_ident())
