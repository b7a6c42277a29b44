"""Request dispatch: one function per method; any failure becomes an error reply."""

from __future__ import annotations

import os
import socket
import sys
import traceback
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .. import __version__
from ..originals import get_ident
from ..protocol.frames import MAX_HEADER_BYTES, PREFIX, Frame, FrameError, frame_buffers
from ..protocol.messages import PROTOCOL_VERSION, error_reply, ok_reply, parse_request
from ..schema.tables import AGENT_TABLES as TABLES
from .identity import python_version, working_directory
from .listener.rank import rank_identity
from .requests import ErrorKind, RequestError, bool_param, float_param, int_param, str_param, type_name
from .tables import BUILDERS
from .threads import errors as thread_errors

if TYPE_CHECKING:
    from ..protocol.frames import ByteChunk

    Reply = Tuple[Dict[str, Any], List[ByteChunk]]


# What an error reply's header carries of a message or a traceback: a message can quote what
# the request sent (16 MB at most) or a huge exception text, and a header over
# MAX_HEADER_BYTES would be refused by the client whole (JSON escapes non-ASCII to 6 bytes).
MAX_MESSAGE_CHARS = 4000
MAX_TRACEBACK_CHARS = 50_000


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]} [probing: {len(text) - limit} more characters were dropped]"


def _hello(server: Any, params: Dict[str, Any]) -> Any:
    client_version = params.get("protocol")
    if client_version is not None and (
        isinstance(client_version, bool) or not isinstance(client_version, int)
    ):
        # Said as it is: "the agent speaks protocol 1, the client 1" for a "1" helped nobody.
        raise RequestError(
            ErrorKind.BAD_REQUEST,
            f"hello 'protocol' must be an integer (this agent speaks {PROTOCOL_VERSION}), "
            f"not {type_name(client_version)} {client_version!r:.80}",
            protocol=PROTOCOL_VERSION,
        )
    str_param(params, "client")
    if client_version is not None and client_version != PROTOCOL_VERSION:
        raise RequestError(
            ErrorKind.PROTOCOL_MISMATCH,
            f"the agent speaks protocol {PROTOCOL_VERSION}, the client {client_version}",
            protocol=PROTOCOL_VERSION,
        )
    return {
        "protocol": PROTOCOL_VERSION,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "python_version": python_version(),
        "implementation": sys.implementation.name,
        "probing_version": __version__,
        "argv": list(sys.argv),
        "cwd": working_directory(),
        "executable": sys.executable,
        "socket": server.path,
        "capabilities": sorted(METHODS),
        "tables": sorted(TABLES),
        "node": socket.gethostname(),
        "listener": _listener_state(server),
        "listen_error": _listen_error(server),
        "rank": rank_identity(),
        # What the agent's own threads ended with, kept from the job's hooks (threads.py).
        "thread_errors": list(thread_errors),
    }


def _listener_state(server: Any) -> Optional[Dict[str, Any]]:
    listener = server.tcp_listener
    return listener.describe() if listener is not None and listener.running() else None


def _listen_error(server: Any) -> Optional[str]:
    listener = server.tcp_listener
    if listener is not None and not listener.running() and listener.failure is not None:
        return str(listener.failure)
    return server.listen_error  # type: ignore[no-any-return]


# The listener's modules (and the token's HMAC) load only for `listen` and `endpoints`, or when
# a listener starts: most jobs never listen, and hello must not make every job pay for them.


def _listen(server: Any, params: Dict[str, Any]) -> Any:
    from .listener.control import ListenError, listen_once

    address = str_param(params, "address") or "auto"
    token = str_param(params, "token")
    try:
        listener, already = listen_once(server, address, token)
    except ListenError as error:
        raise RequestError(ErrorKind.BAD_REQUEST, str(error)) from None
    return dict(listener.describe(), already=already)


def _endpoints(server: Any, params: Dict[str, Any]) -> Any:
    from .listener.registry import Registry, RegistryUnavailable

    listener = server.tcp_listener
    registry = listener.registry if listener is not None else None
    if registry is None:
        if server.registry is None:
            server.registry = Registry(server.own_threads)
        registry = server.registry
    try:
        return registry.endpoints()
    except RegistryUnavailable as error:
        raise RequestError(ErrorKind.NOT_FOUND, str(error)) from None


def _relay(server: Any, params: Dict[str, Any]) -> Reply:
    from .relay import relay  # only a node's relay loads it

    return relay(server, params)


def _watch(server: Any, params: Dict[str, Any]) -> Reply:
    from .watch import watch  # only `hang` of a rank on another node loads it

    return watch(server, params)


def _tables(server: Any, params: Dict[str, Any]) -> Any:
    return {"tables": [table.describe() for table in TABLES.values()]}


def _table(server: Any, params: Dict[str, Any]) -> Reply:
    name = str_param(params, "name")
    table = TABLES.get(name) if name is not None else None
    if table is None:
        raise RequestError(
            ErrorKind.NOT_FOUND, f"no table {name!r:.200}; tables: {', '.join(sorted(TABLES))}"
        )
    # The parameters the table builders read (tables.py), checked here once for all of them.
    str_param(params, "thread")
    bool_param(params, "locals")
    int_param(params, "repr_limit", 1)
    float_param(params, "scan_budget_s", 1.0, 0.0, float("inf"))  # tables.py clamps the range
    float_param(params, "step_wait_s", 1.0, 0.0, 600.0)
    descriptor, chunks = BUILDERS[table.name](server, params).encode()
    return {"table": descriptor}, chunks


def _backtrace(server: Any, params: Dict[str, Any]) -> Reply:
    return _table(server, dict(params, name="python.backtrace"))


def _eval(server: Any, params: Dict[str, Any]) -> Any:
    from .evaluate.evaluation import run_eval

    return run_eval(server.own_threads, params)


def _repl(server: Any, params: Dict[str, Any]) -> Any:
    from .repl.session import handle

    return handle(server.own_threads, params)


def _tracer(server: Any) -> Any:
    from .pytorch import tracer as torchtrace

    try:
        return torchtrace.tracer(server.own_threads)
    except torchtrace.NoTorch as error:
        raise RequestError(ErrorKind.NO_TORCH, str(error)) from None


def _trace(server: Any, params: Dict[str, Any]) -> Any:
    action = params.get("action")
    if not isinstance(action, str) or action not in ("on", "off", "status"):
        raise RequestError(
            ErrorKind.BAD_REQUEST, f"trace action must be on, off or status, not {action!r:.80}"
        )
    tracer = _tracer(server)
    before = tracer.hook_count()
    if action == "on":
        patterns = params.get("modules")
        if patterns is not None and (
            not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns)
        ):
            raise RequestError(ErrorKind.BAD_REQUEST, "modules must be a list of glob patterns")
        try:
            tracer.configure_trace(
                int_param(params, "every", 1), bool_param(params, "backward"), patterns or None,
                int_param(params, "depth", 0), int_param(params, "capacity", 1),
            )  # fmt: skip
        except ValueError as error:
            raise RequestError(ErrorKind.BAD_REQUEST, str(error)) from None
    elif action == "off":
        tracer.trace_off()
    return {"status": tracer.status(), "hooks_before": before, "hooks_after": tracer.hook_count()}


def _nan(server: Any, params: Dict[str, Any]) -> Any:
    action = params.get("action")
    if not isinstance(action, str) or action not in ("on", "off", "status"):
        raise RequestError(ErrorKind.BAD_REQUEST, f"nan action must be on, off or status, not {action!r:.80}")
    stop = bool_param(params, "stop")
    tracer = _tracer(server)
    before = tracer.hook_count()
    if action != "status":
        tracer.configure_nan(action == "on", stop)
    return {"status": tracer.status(), "hooks_before": before, "hooks_after": tracer.hook_count()}


def _memory(server: Any, params: Dict[str, Any]) -> Any:
    action = params.get("action") or "summary"
    if not isinstance(action, str):
        raise RequestError(ErrorKind.BAD_REQUEST, f"memory action must be a string, not {type_name(action)}")
    budget = float_param(params, "scan_budget_s", 1.0, 0.001, 3600.0)
    top = int_param(params, "top", 1) or 20
    if action == "summary":
        from .memory.census import summary

        return summary(budget, top)
    if action == "growth":
        from .connections import client_gone
        from .memory.growth import watch

        return watch(float_param(params, "seconds", 10.0, 0.01, 86400.0), budget, top, client_gone)
    if action == "interval":
        from .memory.sampler import MIN_INTERVAL_S, start_sampling

        interval = float_param(params, "interval_s", 1.0, 0.0, 86400.0)
        if 0 < interval < MIN_INTERVAL_S:
            raise RequestError(
                ErrorKind.BAD_REQUEST, f"interval_s must be 0 (off) or at least {MIN_INTERVAL_S:g} s"
            )
        sampler = start_sampling(server.own_threads, interval)
        return {"sampler": sampler.status() if sampler is not None else None}
    if action == "cuda_snapshot":
        return _cuda_snapshot()
    raise RequestError(
        ErrorKind.BAD_REQUEST,
        f"memory action must be summary, growth, interval or cuda_snapshot, not {action!r:.80}",
    )


def _cuda_snapshot() -> Reply:
    import pickle

    from .memory.cuda import cuda_module

    cuda = cuda_module()
    if cuda is None:
        imported = "torch" in sys.modules
        raise RequestError(
            ErrorKind.NO_CUDA if imported else ErrorKind.NO_TORCH,
            "the process has not initialised CUDA" if imported else "the process has not imported torch",
        )
    snapshot = cuda.memory._snapshot()
    data = pickle.dumps(snapshot)
    segments = snapshot.get("segments", []) if isinstance(snapshot, dict) else []
    history = bool(isinstance(snapshot, dict) and any(snapshot.get("device_traces") or ())) or any(
        block.get("frames") for segment in segments for block in segment.get("blocks", ())
    )
    return {"bytes": len(data), "segments": len(segments), "has_history": history}, [data]


def _sample(server: Any, params: Dict[str, Any]) -> Reply:
    from .connections import client_gone
    from .stack_sampler import DEFAULT_RATE_HZ, MAX_DURATION_S, MAX_RATE_HZ, sample_stacks

    duration = float_param(params, "duration_s", 10.0, 0.01, MAX_DURATION_S)
    rate = float_param(params, "rate_hz", DEFAULT_RATE_HZ, 0.1, MAX_RATE_HZ)
    data = sample_stacks(server.own_threads, duration, rate, client_gone)
    return {"bytes": len(data)}, [data]


def _ping(server: Any, params: Dict[str, Any]) -> Any:
    return {"pong": True}


def _record(server: Any, params: Dict[str, Any]) -> Any:
    from .records import record_now
    from .records.writer import RecordFailed

    kind = str_param(params, "kind") or "on_demand"
    if kind not in ("on_demand", "watchdog"):
        raise RequestError(
            ErrorKind.BAD_REQUEST, f"record kind must be on_demand or watchdog, not {kind!r:.80}"
        )
    try:
        return record_now(server, kind, str_param(params, "reason") or "")
    except RecordFailed as error:
        raise RequestError(
            ErrorKind.PERMISSION_DENIED if error.refused else ErrorKind.INTERNAL_ERROR, f"no record: {error}"
        ) from None


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
    "sample": _sample,
    "detach": _detach,
    "record": _record,
    "listen": _listen,
    "endpoints": _endpoints,
    "relay": _relay,
    "watch": _watch,
}


class Dispatcher:
    """One per connection. After a failed hello (another protocol version, or a malformed one)
    nothing else is served on that connection:
    a client of another protocol version pipelines its first request behind the hello, and
    that request (an eval, say) must not run."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.refused: Optional[str] = None

    def handle(self, frame: Frame) -> Reply:
        try:
            request_id, method, params = parse_request(frame.header)
        except FrameError as error:
            return error_reply(error.request_id, ErrorKind.BAD_REQUEST, str(error)), []
        if self.refused is not None:
            return error_reply(request_id, ErrorKind.PROTOCOL_MISMATCH, self.refused), []
        handler = METHODS.get(method)
        if handler is None:
            message = f"unknown method {method!r}; methods: {', '.join(sorted(METHODS))}"
            return error_reply(request_id, ErrorKind.UNKNOWN_METHOD, message), []
        try:
            result = handler(self.server, params)
        except RequestError as error:
            if error.error_type == ErrorKind.PROTOCOL_MISMATCH or method == "hello":
                self.refused = error.message
            details = dict(error.details)
            # An error's texts (eval's output and traceback) travel in the payload.
            payload = details.pop("payload", [])
            message = _cut(error.message, MAX_MESSAGE_CHARS)
            return error_reply(request_id, error.error_type, message, **details), payload
        except Exception as error:  # noqa: BLE001 - a failing handler must not kill the agent
            return error_reply(
                request_id, ErrorKind.INTERNAL_ERROR,
                _cut(f"{type(error).__name__}: {error}", MAX_MESSAGE_CHARS),
                traceback=_cut(traceback.format_exc(), MAX_TRACEBACK_CHARS),
            ), []  # fmt: skip
        if isinstance(result, tuple):
            return ok_reply(request_id, result[0]), result[1]
        return ok_reply(request_id, result), []

    def close(self) -> None:
        """The connection is gone (its client may have been killed): a repl statement it was
        waiting on must not run on, a `while True: pass` burning the job's CPU."""
        repl = sys.modules.get(__package__ + ".repl.session")
        if repl is not None:
            repl.connection_closed(get_ident())


def reply_buffers(reply: Dict[str, Any], payload: Any) -> List[Any]:
    """The frame of a reply; one whose header would pass the cap that every reader enforces
    becomes an error reply that says so (the client would otherwise refuse the whole frame)."""
    buffers = frame_buffers(reply, payload)
    size = len(buffers[0]) - PREFIX.size
    if size <= MAX_HEADER_BYTES:
        return buffers
    message = f"the reply's header of {size} bytes exceeds the cap of {MAX_HEADER_BYTES}"
    return frame_buffers(error_reply(reply.get("id"), ErrorKind.REPLY_TOO_LARGE, message))
