"""What each command does: resolve the target, ask the agent, render. Shared by click and the
fast path; returns the exit code. Heavy modules (duckdb, psutil) are imported by the commands
that need them, never here at the top.
"""

from __future__ import annotations

import os
import stat
import sys
import time

from ..client import Client, locate_socket
from ..errors import ExitCode, NoAgent, UsageError
from . import render

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional

    from ..client import Log

# Room the CLI leaves, beyond an eval's own timeout, for the agent to interrupt it and reply.
EVAL_REPLY_GRACE_S = 3.0


class Target:
    __slots__ = ("pid", "socket")

    def __init__(self, pid: Optional[int], socket: Optional[str]) -> None:
        self.pid = pid
        self.socket = socket


def parse_target(text: Optional[str]) -> Target:
    if text is None:
        raise UsageError("this command needs a target: probing PID COMMAND (or -t PID)")
    if text.isdigit():
        return Target(int(text), None)
    try:
        if stat.S_ISSOCK(os.stat(text).st_mode):
            return Target(None, text)
    except OSError:
        pass
    raise UsageError(f"TARGET must be a PID or the path of an agent socket, not {text!r}")


class Context:
    """What the global options say: the target, whether to narrate (-v), whether to attach."""

    __slots__ = ("target", "verbose", "no_attach", "attach_timeout")

    def __init__(
        self, target: Optional[str], verbose: bool, no_attach: bool = False, attach_timeout: float = 5.0
    ) -> None:
        self.target = target
        self.verbose = verbose
        self.no_attach = no_attach
        self.attach_timeout = attach_timeout

    @property
    def log(self) -> Log:
        return render.log_to_stderr if self.verbose else _quiet

    def connect(self, timeout: float) -> Client:
        """A client of the target's agent; a process without one is attached to first."""
        target = parse_target(self.target)
        if target.socket is not None:
            return Client(target.socket, timeout, self.log)
        pid = target.pid or 0
        try:
            path = locate_socket(pid, self.log)
        except NoAgent:
            if self.no_attach:
                raise
            from ..attach import attach

            path = attach(pid, "auto", self.attach_timeout, self.log).socket
        return Client(path, timeout, self.log)


def _quiet(message: str) -> None:
    pass


def _read_argument(value: str, what: str) -> str:
    """`-` means: read it from standard input (for code or SQL with quotes and newlines)."""
    text = sys.stdin.read() if value == "-" else value
    if not text.strip():
        raise UsageError(f"empty {what}")
    return text


def backtrace(context: Context, locals: bool, thread: Optional[str], format: str, timeout: float) -> int:
    with context.connect(timeout) as client:
        params = {"locals": locals, "thread": thread}
        table = client.backtrace(params)
        info = client.info
    rows = table.to_rows()
    if format == "text":
        render.write_backtrace_text(rows, info, sys.stdout, parse_target(context.target).pid)
    else:
        names = [column.name for column in table.columns]
        types = [column.type for column in table.columns]
        render.write_rows(
            names, types, [tuple(row[name] for name in names) for row in rows], format, sys.stdout
        )
    return ExitCode.OK


def evaluate(context: Context, code: str, frame: Optional[str], timeout: float) -> int:
    source = _read_argument(code, "code")
    with context.connect(min(timeout, 5.0)) as client:
        params = {"code": source, "frame": frame, "timeout": timeout}
        result, _ = client.call("eval", params, timeout=timeout + EVAL_REPLY_GRACE_S)
    render.write_eval_result(result, sys.stdout, sys.stderr)
    return ExitCode.OK


def query(context: Context, sql: str, format: str, timeout: float) -> int:
    from ..sql import SqlSession

    text = _read_argument(sql, "SQL")
    with context.connect(timeout) as client:
        session = SqlSession(client.describe_tables())
        for name in session.referenced_tables(text):
            context.log(f"fetching {name}")
            session.load(client.fetch_table(name))
    result = session.run(text)
    render.write_rows(result.columns, result.types, result.rows, format, sys.stdout)
    return ExitCode.OK


def tables(context: Context, format: str, timeout: float) -> int:
    with context.connect(timeout) as client:
        described = client.describe_tables()
    if format == "json":
        import json

        json.dump(described, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render.write_tables(described, sys.stdout)
    return ExitCode.OK


def inject(context: Context, method: str, format: str) -> int:
    from ..attach import attach

    target = parse_target(context.target)
    if target.pid is None:
        raise UsageError("inject needs a PID, not a socket path")
    attached = attach(target.pid, method, context.attach_timeout, context.log)
    render.write_attach(target.pid, attached, format, sys.stdout)
    return ExitCode.OK


def detach(context: Context, timeout: float) -> int:
    target = parse_target(context.target)
    with Client(target.socket or locate_socket(target.pid or 0, context.log), timeout, context.log) as client:
        client.call("detach")
        pid, path = client.info.get("pid"), client.info.get("socket")
    # The agent stops right after its reply; wait until its socket is gone.
    deadline = time.monotonic() + timeout
    while path and os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    sys.stdout.write(f"PID {pid}: agent stopped (threads, hooks and socket removed); the job runs on\n")
    return ExitCode.OK


def list_processes(format: str) -> int:
    from ..listing import python_processes

    found = python_processes()
    columns = ["pid", "user", "python", "agent", "command"]
    types = ["BIGINT", "VARCHAR", "VARCHAR", "BOOLEAN", "VARCHAR"]
    rows = [(p.pid, p.user, p.python_version, p.agent, p.command) for p in found]
    render.write_rows(columns, types, rows, format, sys.stdout)
    return ExitCode.OK


def run(command: List[str], verbose: bool) -> int:
    from ..launcher import Launcher

    if not command:
        raise UsageError("nothing to run: probing run -- python train.py")
    launcher = Launcher(command)
    child = launcher.start()
    sys.stderr.write(f"probing: started PID {child.pid}: {' '.join(command)}\n")
    sys.stderr.flush()
    return launcher.wait()
