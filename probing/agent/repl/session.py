"""repl: interactive console sessions inside the target, as `code.InteractiveConsole` runs them.

A session buffers the lines of an incomplete statement (the target's own `codeop` decides when
one is complete, so its Python version decides the syntax), keeps the `from __future__` flags
of what it ran, and owns a namespace (namespace.py). A complete statement runs in a worker
thread `probing-repl-N`; what it prints is captured per thread (output.py) and handed out in
pieces: the reply to `push`, then each `poll`, waits up to REPLY_WAIT_S for the statement and
carries what it printed since the reply before. `interrupt` raises KeyboardInterrupt in the
worker, at its next bytecode (a blocking C call is interrupted when it returns).

Sessions live in this module, not in a connection: the agent closes connections idle for
10 minutes, or sooner when it needs the slot for a new client (server.py), and the client
reconnects to the same session. A connection that closes while a statement it started still
runs (the client was killed) interrupts that statement. Output too big for one reply goes out
in the next ones (fit_json), and the statement is reported done only once all of it is out.
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import traceback
from typing import Any, Dict, List, Optional, Tuple

from ...originals import allocate_lock, get_ident, monotonic
from ..evaluate.framenames import AmbiguousName, FrameNames, frames_for
from ..evaluate.namespace import SessionNamespace
from ..evaluate.statements import (
    FUTURE_FLAGS,
    Statement,
    command_compiler,
    compile_statement,
    completer,
    is_blank,
)
from ..identity import python_version
from ..lifecycle import SESSIONS, on_stop
from ..output import captured
from ..requests import ErrorKind, RequestError

MAX_SESSIONS = 16
# A session nobody has used for this long is dropped, with the names it holds.
SESSION_IDLE_S = 3600.0
# How long a reply waits for the running statement before it carries what it has.
REPLY_WAIT_S = 0.3
# Once output arrives, gather a little more, so a loop printing line by line sends a few
# lines per reply rather than a reply per line.
GATHER_S = 0.05
# Sources of earlier statements kept for tracebacks through functions defined in the session.
MAX_SOURCES = 1000
# How long stop() waits for interrupted statements to end before it lets them go.
STOP_WAIT_S = 1.0
# What one reply carries of each stream, as JSON in its header (capped at 1 MiB, and JSON
# escapes a non-ASCII character to up to 12 bytes): the rest goes in the next replies, which
# come at once. A statement printing 1.1 MB at once used to fail the reply whole.
REPLY_TEXT_BYTES = 192 << 10
# Output handed out but not yet carried beyond this is dropped, with a line that says so.
MAX_BACKLOG_CHARS = 4 << 20

_numbers = itertools.count(1)
_sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()
_sessions_lock = allocate_lock()


class Session:
    """One console: its buffered lines, compiler flags, namespace and running statement."""

    def __init__(self, token: str, own_threads: Any) -> None:
        self.token = token
        self.own_threads = own_threads
        self.namespace = SessionNamespace()
        self.compiler = command_compiler()
        self.lines: List[str] = []
        self.number: Optional[int] = None
        self.running: Optional[Statement] = None
        self.sources: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.lock = allocate_lock()
        self.last_used = monotonic()
        # Output of the running statement taken from its buffers but too big for one reply.
        self.backlog = {"stdout": "", "stderr": ""}

    def push(self, line: str, owner: int) -> Dict[str, Any]:
        """code.InteractiveConsole.push: buffer the line; run the source once it is complete."""
        with self.lock:
            running = self.running
            if running is not None and not running.done.is_set():
                if not running.interrupted:
                    raise RequestError(
                        ErrorKind.STATEMENT_RUNNING, "a statement is still running in this session"
                    )
                # The client stopped waiting for a statement blocked outside Python, which ends
                # when it returns to Python; what it prints from now on is not shown.
                self.running = None
            self.lines.append(line)
            source = "\n".join(self.lines)
            if self.number is None:
                self.number = next(_numbers)
            filename = f"<probing-repl-{self.number}>"
            try:
                with captured():  # the trial compiles' warnings: the final compile repeats them
                    complete = self.compiler(source, filename, "single")
                if complete is None:
                    return {"more": True}
                with captured() as (_, warned):
                    code = None if is_blank(source) else compile_statement(source, filename, self._flags())
            except Exception as error:  # noqa: BLE001 - SyntaxError mostly; RecursionError for deep nesting
                self._reset()
                text = "".join(traceback.format_exception_only(type(error), error))
                return _finished_reply(type(error).__name__, text)
            number, warnings = self.number, warned.getvalue()
            self._reset()
            if code is None:
                return _finished_reply(None, "")
            try:
                frames = self._frames(code)
            except AmbiguousName as error:
                return dict(_finished_reply("NameError", f"NameError: {error}\n"), stderr=error.notes)
            self._remember(filename, source)
            statement = Statement(code, self.namespace, self.sources, self.own_threads, number, owner, frames)
            if warnings:
                statement.err.write(warnings)
            try:
                statement.thread.start()
            except RuntimeError as error:  # can't start new thread
                return _finished_reply("RuntimeError", f"RuntimeError: {error}\n")
            self.running = statement
            self.backlog = {"stdout": "", "stderr": ""}
        return self.collect(statement, owner)

    def _frames(self, code: Any) -> Optional[FrameNames]:
        """The job's frames, for a statement naming what neither the session, __main__ nor the
        builtins hold."""
        namespace = self.namespace
        main = getattr(sys.modules.get("__main__"), "__dict__", {})

        def present(name: str) -> bool:
            return dict.__contains__(namespace, name) or name in main or name in namespace.builtins

        return frames_for(self.own_threads, present, [code], for_new_names=True)

    def _flags(self) -> int:
        return int(getattr(self.compiler.compiler, "flags", 0)) & FUTURE_FLAGS

    def _reset(self) -> None:
        self.lines = []
        self.number = None

    def reset(self) -> Dict[str, Any]:
        with self.lock:
            self._reset()
        return {"more": False}

    def _remember(self, filename: str, source: str) -> None:
        self.sources[filename] = source
        while len(self.sources) > MAX_SOURCES:
            self.sources.popitem(last=False)

    def poll(self, owner: int) -> Dict[str, Any]:
        statement = self.running
        if statement is None:
            return dict(_finished_reply(None, ""), idle=True)
        return self.collect(statement, owner)

    def collect(self, statement: Statement, owner: int) -> Dict[str, Any]:
        """Wait a moment for the statement; what it printed since the last reply, and its end."""
        statement.owner = owner
        backlog = self.backlog
        behind = any(backlog.values())
        if not behind and not statement.done.is_set() and statement.activity.wait(REPLY_WAIT_S):
            statement.done.wait(GATHER_S)
        # In this order: output written before `done` was seen is all taken below.
        statement.activity.clear()
        done = statement.done.is_set()
        backlog["stdout"] = _bounded(backlog["stdout"] + statement.out.take())
        backlog["stderr"] = _bounded(backlog["stderr"] + statement.err.take())
        stdout, backlog["stdout"] = fit_json(backlog["stdout"], REPLY_TEXT_BYTES)
        stderr, backlog["stderr"] = fit_json(backlog["stderr"], REPLY_TEXT_BYTES)
        # Done only once everything it printed has been handed out.
        done = done and not any(backlog.values())
        reply = {"more": False, "done": done, "stdout": stdout, "stderr": stderr}
        if done:
            text, rest = fit_json(statement.traceback, REPLY_TEXT_BYTES)
            if rest:
                text += f"\n[probing: {len(rest)} more characters of the traceback were dropped]\n"
            reply.update(exception=statement.exception, traceback=text, leave=statement.leave)
            with self.lock:
                if self.running is statement:
                    self.running = None
        return reply

    def interrupt(self) -> Dict[str, Any]:
        statement = self.running
        return {"interrupted": statement is not None and statement.interrupt()}

    def complete(self, text: str) -> List[str]:
        """What rlcompleter offers for `text` over the session's names and __main__'s."""
        main = sys.modules.get("__main__")
        names: Dict[str, Any] = dict(getattr(main, "__dict__", {}))
        names.update(self.namespace)
        found: List[str] = []
        with captured():  # a property the completer reads may print
            offer = completer(names)
            for state in range(1000):
                match = offer.complete(text, state)
                if match is None:
                    break
                found.append(match)
        return found

    def drop(self) -> None:
        statement = self.running
        if statement is not None:
            statement.interrupt()


def fit_json(text: str, budget: int) -> Tuple[str, str]:
    """(head, rest): the longest head of `text` whose JSON form fits in `budget` bytes."""
    from ...protocol.frames import json_dumps

    if len(text) * 12 <= budget:  # 12: the longest escape of one character (a surrogate pair)
        return text, ""
    size = len(json_dumps(text))
    if size <= budget:
        return text, ""
    count = max(1, len(text) * budget // size)
    while count > 1 and len(json_dumps(text[:count])) > budget:
        count = count * 9 // 10
    return text[:count], text[count:]


def _bounded(text: str) -> str:
    if len(text) <= MAX_BACKLOG_CHARS:
        return text
    dropped = len(text) - MAX_BACKLOG_CHARS
    return (
        text[:MAX_BACKLOG_CHARS]
        + f"\n[probing: {dropped} characters of output were dropped: the client fell behind]\n"
    )


def _finished_reply(exception: Optional[str], text: str) -> Dict[str, Any]:
    return {"more": False, "done": True, "stdout": "", "stderr": "", "exception": exception,
            "traceback": text, "leave": False}  # fmt: skip


# --- the sessions of this process ------------------------------------------------------------


def _open(own_threads: Any) -> Dict[str, Any]:
    on_stop(drop_all, SESSIONS)
    session = Session(os.urandom(8).hex(), own_threads)
    with _sessions_lock:
        _sessions[session.token] = session
    _sweep()
    return {"session": session.token, "pid": os.getpid(), "python_version": python_version(),
            "argv": list(sys.argv)}  # fmt: skip


def _sweep() -> None:
    """Drop the least recently used sessions beyond MAX_SESSIONS, and sessions nobody used for
    SESSION_IDLE_S: a client killed without saying goodbye must not pin its names' memory
    (a tensor it made) in the job forever. Done on requests: the agent keeps no timer."""
    now = monotonic()
    with _sessions_lock:
        dropped = [
            session
            for session in _sessions.values()
            if now - session.last_used > SESSION_IDLE_S and session.running is None
        ]
        for session in dropped:
            del _sessions[session.token]
        while len(_sessions) > MAX_SESSIONS:
            dropped.append(_sessions.popitem(last=False)[1])
    for session in dropped:
        session.drop()


def _session(params: Dict[str, Any]) -> Session:
    _sweep()
    token = params.get("session")
    with _sessions_lock:
        session = _sessions.get(token) if isinstance(token, str) else None
        if session is not None:
            _sessions.move_to_end(token)  # type: ignore[arg-type]
            session.last_used = monotonic()
    if session is None:
        raise RequestError(
            ErrorKind.NO_SESSION,
            f"no repl session {token!r:.40} in this process (closed, unused for an hour, or dropped "
            "for a newer one)",
        )
    return session


def handle(own_threads: Any, params: Dict[str, Any]) -> Dict[str, Any]:
    """The `repl` method; the calling connection thread owns the statements it waits on."""
    action = params.get("action")
    owner = get_ident()
    if action == "open":
        return _open(own_threads)
    if not isinstance(action, str) or action not in (
        "push",
        "poll",
        "interrupt",
        "reset",
        "complete",
        "close",
    ):
        raise RequestError(
            ErrorKind.BAD_REQUEST,
            f"repl action must be open, push, poll, interrupt, reset, complete or close, not {action!r:.80}",
        )
    if not isinstance(params.get("session"), str):
        raise RequestError(ErrorKind.BAD_REQUEST, f"repl {action} needs a 'session' string (from open)")
    session = _session(params)
    if action == "push":
        line = params.get("line")
        if not isinstance(line, str):
            raise RequestError(ErrorKind.BAD_REQUEST, "repl push needs a 'line' string")
        return session.push(line, owner)
    if action == "poll":
        return session.poll(owner)
    if action == "interrupt":
        return session.interrupt()
    if action == "reset":
        return session.reset()
    if action == "complete":
        text = params.get("text")
        if not isinstance(text, str):
            raise RequestError(ErrorKind.BAD_REQUEST, "repl complete needs a 'text' string")
        return {"matches": session.complete(text)}
    with _sessions_lock:
        _sessions.pop(session.token, None)
    session.drop()
    return {"closed": True}


def connection_closed(owner: int) -> None:
    """The client of connection thread `owner` is gone: interrupt what it was waiting on."""
    with _sessions_lock:
        sessions = list(_sessions.values())
    for session in sessions:
        statement = session.running
        if statement is not None and statement.owner == owner and not statement.done.is_set():
            statement.interrupt()


def drop_all() -> None:
    """The agent stops: every session goes, and running statements are interrupted."""
    with _sessions_lock:
        sessions = list(_sessions.values())
        _sessions.clear()
    running = [session.running for session in sessions if session.running is not None]
    for statement in running:
        statement.interrupt()
    deadline = monotonic() + STOP_WAIT_S
    for statement in running:
        statement.done.wait(max(0.0, deadline - monotonic()))


def _forget_after_fork() -> None:
    # A forked child (a DataLoader worker) has none of the statements' threads, and the lock
    # may have been held by a thread that does not exist there.
    global _sessions_lock
    _sessions_lock = allocate_lock()
    _sessions.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
