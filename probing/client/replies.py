"""Reading and checking an agent's replies on the CLI side: the job is untrusted input.

Whatever answers on the socket may be a hostile job (root inspects other users' jobs), a
different probing version, or not an agent at all. So every length it announces is capped
and no memory is reserved for bytes that have not arrived; every reply is checked against
the shape the CLI will read before anything reads it; and anything else becomes a BadReply
(exit code 13) that says so, never a traceback.

Stdlib only and cheap to import: on the path of every `probing PID backtrace`.
"""

from __future__ import annotations

import _socket
import time

from ..errors import (
    AgentBusy,
    AgentFailed,
    AgentTimeout,
    AgentUnreachable,
    BadReply,
    EvalTimedOut,
    GilDisabled,
    NoCuda,
    NotFound,
    NoTorch,
    PermissionDenied,
    ProbingError,
    ProtocolMismatch,
    RecordNotWritten,
    RemoteError,
    RequestRefused,
    SessionGone,
)
from ..protocol.frames import MAGIC, MAX_HEADER_BYTES, PREFIX, ConnectionClosed, Frame, FrameError, json_loads
from ..protocol.messages import ErrorKind
from ..protocol.texts import decode_texts, quoted
from ..schema.column_check import mismatched_column

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple, Type

    from ..protocol.frames import ByteChunk
    from ..protocol.tables import DecodedTable


# Big payloads are read this much at a time, and the buffer grows only as bytes arrive.
READ_CHUNK = 1 << 20


class ReplyReader:
    """Frames from an agent, read within a deadline and without trusting announced lengths.

    Reads ahead (up to 64 KiB) so that a hello and the reply sent behind it cost one recv().
    """

    def __init__(self, sock: Any, max_bytes: int) -> None:
        self.sock = sock
        self.max_bytes = max_bytes
        self.pending = bytearray()
        self._deadline = 0.0

    def _recv(self, size: int) -> bytes:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        # A per-call timeout alone would let a peer that drips one byte a second hold the
        # CLI forever: each recv gets only what is left of the whole reply's time.
        self.sock.settimeout(left)
        chunk: bytes = self.sock.recv(size)
        return chunk

    def _take(self, size: int, what: str) -> bytearray:
        pending = self.pending
        while len(pending) < size:
            chunk = self._recv(max(1 << 16, min(size - len(pending), READ_CHUNK)))
            if not chunk:
                raise ConnectionClosed(f"closed after {len(pending)} of {size} bytes of {what}")
            pending += chunk
        if len(pending) == size:
            self.pending = bytearray()
            return pending
        data = pending[:size]
        del pending[:size]
        return data

    def read(self, timeout: float) -> Optional[Frame]:
        """The next frame, or None when the peer closed cleanly before it."""
        self._deadline = time.monotonic() + timeout
        if not self.pending:
            first = self._recv(1 << 16)
            if not first:
                return None
            self.pending += first
        prefix = self._take(PREFIX.size, "a frame prefix")
        magic, header_length, payload_length = PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise BadReply("the process answering on the socket does not speak probing's protocol")
        if header_length > MAX_HEADER_BYTES:
            raise BadReply(
                f"the agent announced a reply header of {header_length} bytes (the cap is {MAX_HEADER_BYTES})"
            )
        if header_length + payload_length > self.max_bytes:
            raise BadReply(
                f"the agent announced a reply of {header_length + payload_length} bytes "
                f"(the cap is {self.max_bytes})"
            )
        header_bytes = self._take(header_length, "the reply header")
        payload = self._take(payload_length, "the reply's data") if payload_length else bytearray()
        try:
            header = json_loads(header_bytes.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as error:
            raise BadReply(f"the agent's reply header is not valid JSON: {error}") from None
        if not isinstance(header, dict):
            raise BadReply("the agent's reply header is not a JSON object")
        return Frame(header, payload)


def read_reply(reader: ReplyReader, method: str, wait: float) -> Frame:
    """The next frame, with every way of not getting one turned into a ProbingError."""
    try:
        frame = reader.read(wait)
    except (TimeoutError, _socket.timeout):
        raise AgentTimeout(
            f"the agent did not answer {method!r} within {wait:g} s",
            hint="the process may be holding the GIL in native code; "
            "`py-spy dump --pid PID` reads its stacks from outside",
        ) from None
    except OSError:  # reset by the peer: it went away
        frame = None
    except ConnectionClosed:
        frame = None
    if frame is None:
        raise AgentUnreachable(f"the agent closed the connection during {method!r} (did the process exit?)")
    return frame


# --- the shape of each reply the CLI reads ---------------------------------------------------
#
# Only what the CLI indexes or renders is checked; more keys are fine (a newer agent).
# Each entry: key -> accepted types (None in the tuple: the key may be missing or null).

_TEXT = (str, type(None))
SHAPES: Dict[str, Dict[str, Tuple[Any, ...]]] = {
    "hello": {"pid": (int, type(None)), "python_version": _TEXT, "argv": (list, type(None))},
    "eval": {"stdout": _TEXT, "stderr": _TEXT, "value": _TEXT},
    "tables": {"tables": (list,)},
    "table": {"table": (dict,)},
    "backtrace": {"table": (dict,)},
    "trace": {"status": (dict,), "hooks_before": (int,), "hooks_after": (int,)},
    "nan": {"status": (dict,), "hooks_before": (int,), "hooks_after": (int,)},
}


class CheckedDict(dict):  # type: ignore[type-arg]
    """A reply object: a key the agent left out is a BadReply, not a KeyError traceback."""

    def __missing__(self, key: Any) -> Any:
        raise BadReply(f"the agent's reply has no {key!r}")


def _checked(value: Any, depth: int = 0) -> Any:
    if depth > 64:
        raise BadReply("the agent's reply is nested too deeply")
    if isinstance(value, dict):
        return CheckedDict((key, _checked(item, depth + 1)) for key, item in value.items())
    if isinstance(value, list):
        return [_checked(item, depth + 1) for item in value]
    return value


def check_result(method: str, result: Any) -> Dict[str, Any]:
    """The result of a successful reply, checked against what the CLI will read from it."""
    if not isinstance(result, dict):
        raise BadReply(f"the agent's answer to {method!r} is a {type(result).__name__}, not an object")
    for key, types in SHAPES.get(method, {}).items():
        value = result.get(key)
        if not isinstance(value, types) or (value is None and type(None) not in types):
            raise BadReply(f"the agent's answer to {method!r} has {key!r} of type {type(value).__name__}")
    if method == "tables":
        _check_described(result["tables"])
    if method == "hello" and not all(isinstance(arg, str) for arg in result.get("argv") or ()):
        raise BadReply("the agent's hello has an argv that is not a list of strings")
    checked: Dict[str, Any] = _checked(result)
    return checked


def _check_described(tables: List[Any]) -> None:
    for table in tables:
        if not isinstance(table, dict) or not isinstance(table.get("name"), str):
            raise BadReply("the agent's list of tables holds an entry without a name")
        columns = table.get("columns")
        if not isinstance(columns, list) or not columns:
            raise BadReply(f"the agent describes table {quoted(table['name'])} without columns")
        for column in columns:
            if not isinstance(column, dict) or not all(
                isinstance(column.get(key), str) for key in ("name", "type")
            ):
                raise BadReply(
                    f"the agent describes a column of {quoted(table['name'])} without a name or type"
                )
        if not isinstance(table.get("doc", ""), str):
            raise BadReply(f"the agent's description of {quoted(table['name'])} is not text")


# The most of an agent's error message the CLI quotes: it becomes one line of ours (one per rank,
# with --ranks). A remote traceback, and what eval printed, travel in fields of their own, whole.
MAX_ERROR_MESSAGE_CHARS = 4000


def check_error(error: Dict[str, Any]) -> Dict[str, Any]:
    """An error reply's fields, each text (what the job sent is rendered, never trusted); a
    message that says nothing is replaced, a very long one cut."""
    checked = {key: value for key, value in error.items() if isinstance(value, str)}
    message = checked.get("message", "")
    if not message.strip():
        checked["message"] = "the agent replied with an error and no message"
    elif len(message) > MAX_ERROR_MESSAGE_CHARS:
        cut = message[: MAX_ERROR_MESSAGE_CHARS - 40]
        checked["message"] = f"{cut}... (cut at {len(cut)} of {len(message)} characters)"
    return checked


def decode_reply_table(result: Dict[str, Any], payload: bytearray) -> DecodedTable:
    """The table of a `table` or `backtrace` reply, checked: a malformed one, or a known table
    with a column of another type than its schema's, is a BadReply."""
    # Not at the top: a backtrace read from outside (py-spy) decodes no table.
    from ..protocol.tables import decode_table

    try:
        table = decode_table(result["table"], payload)
    except FrameError as error:
        raise BadReply(str(error)) from None
    mismatch = mismatched_column(table.name, ((column.name, column.type) for column in table.columns))
    if mismatch is not None:
        raise BadReply(f"the agent's reply: {mismatch}")
    return table


def decode_reply_texts(result: Dict[str, Any], payload: ByteChunk) -> Dict[str, Any]:
    """A reply whose texts (eval's output, value, traceback) travel in the payload, with them in."""
    if "texts" not in result:
        return result
    try:
        return dict(result, **decode_texts(result["texts"], payload))
    except FrameError as error:
        raise BadReply(f"unusable texts in the agent's reply: {error}") from None


# The error each kind of error reply becomes (tests/unit/test_errors.py checks that every kind
# of ErrorKind is here). Busy is an AgentUnreachable: backtrace falls back on it.
ERROR_OF_KIND: Dict[str, Type[ProbingError]] = {
    ErrorKind.BAD_REQUEST: RequestRefused,
    ErrorKind.BAD_FRAME: RequestRefused,
    ErrorKind.UNKNOWN_METHOD: RequestRefused,
    ErrorKind.REPLY_TOO_LARGE: RequestRefused,
    ErrorKind.CANCELLED: RequestRefused,
    ErrorKind.STATEMENT_RUNNING: RequestRefused,
    ErrorKind.PROTOCOL_MISMATCH: ProtocolMismatch,
    ErrorKind.TIMEOUT: RequestRefused,  # the agent hung up on a client that sent nothing in time
    ErrorKind.PERMISSION_DENIED: PermissionDenied,
    ErrorKind.BUSY: AgentBusy,
    ErrorKind.NOT_FOUND: NotFound,
    ErrorKind.INTERNAL_ERROR: AgentFailed,
    ErrorKind.NO_TORCH: NoTorch,
    ErrorKind.NO_CUDA: NoCuda,
    ErrorKind.REMOTE_ERROR: RemoteError,
    ErrorKind.EVAL_TIMEOUT: EvalTimedOut,
    ErrorKind.NO_SESSION: SessionGone,
    ErrorKind.RECORD_NOT_WRITTEN: RecordNotWritten,
    ErrorKind.NO_GIL: GilDisabled,
}


def error_from_reply(error: Dict[str, Any], payload: ByteChunk = b"") -> ProbingError:
    """The ProbingError for an error reply; every field the job sent is checked to be text. A
    kind this CLI does not know (a newer agent) is a plain ProbingError with the agent's message."""
    try:
        error = check_error(decode_reply_texts(error, payload))
    except BadReply as bad:
        return bad
    kind, message = error.get("type"), error["message"]
    cls = ERROR_OF_KIND.get(kind) if isinstance(kind, str) else None
    if cls is RemoteError:
        return RemoteError(
            message,
            traceback=error.get("traceback", ""),
            stdout=error.get("stdout", ""),
            stderr=error.get("stderr", ""),
        )
    if cls is EvalTimedOut:
        return EvalTimedOut(message, stdout=error.get("stdout", ""), stderr=error.get("stderr", ""))
    if cls is AgentFailed:
        return AgentFailed(f"the agent failed: {message}")
    return (cls or ProbingError)(message)


def named_table(name: str, result: Dict[str, Any], payload: bytearray) -> DecodedTable:
    """The table of the reply to a `table` request for `name`, checked, and that table."""
    table = decode_reply_table(result, payload)
    if table.name != name:
        raise BadReply(f"asked for table {name!r}, the agent sent {quoted(table.name)}")
    return table
