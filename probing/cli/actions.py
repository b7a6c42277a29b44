"""What each command does: resolve the target, ask the agent, render. Shared by click and the
fast path; returns the exit code. Heavy modules (duckdb, psutil) are imported by the commands
that need them, never here at the top.
"""

from __future__ import annotations

import os
import stat
import sys
import time

from ..client.connection import Client, decode_reply_table, locate_socket
from ..errors import ExitCode, NoAgent, ProbingError, UsageError
from ..protocol import decode_table
from . import render

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    from ..client.connection import Log

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

    def connect(
        self,
        timeout: float,
        attach_budget: Optional[float] = None,
        give_up_early: bool = False,
        reattach: bool = True,
    ) -> Client:
        """A client of the target's agent; a process without one is attached to first.

        An agent that stopped listening in a live process (its job closed the socket) is
        attached to again, unless `reattach` is False: then Fallback says what happened, for a
        command that can answer from outside instead (backtrace).
        """
        target = parse_target(self.target)
        if target.socket is not None:
            try:
                return Client(target.socket, timeout, self.log)
            except NoAgent as error:
                raise NoAgent(error.message, hint=SOCKET_TARGET_HINT) from None
        pid = target.pid or 0
        try:
            return Client(locate_socket(pid, self.log), timeout, self.log, pid=pid)
        except NoAgent as error:
            from ..attach.liveness import stopped_agent

            stopped = stopped_agent(pid)
            if stopped is not None:
                why = f"the agent in PID {pid} stopped listening (nothing accepts on {stopped})"
                if not reattach:
                    raise Fallback(f"{why}; `probing {pid} inject` starts a new one") from None
                if self.no_attach:
                    raise NoAgent(why, hint=STOPPED_AGENT_HINT.format(pid=pid)) from None
                self.log(f"{why}; attaching again")
            elif self.no_attach:
                raise NoAgent(error.message, hint=error.hint) from None
        from ..attach import attach

        wait = min(self.attach_timeout, attach_budget) if attach_budget else self.attach_timeout
        path = attach(pid, "auto", wait, self.log, give_up_early).socket
        return Client(path, timeout, self.log, pid=pid)


# A socket given as the target is only ever connected to: --no-attach has nothing to do with it.
SOCKET_TARGET_HINT = (
    "give the job's PID instead of its socket: probing attaches to a process that has no agent"
)
STOPPED_AGENT_HINT = (
    "code in the job closed the agent's socket (a job closing its descriptors, or an eval); "
    "drop --no-attach, or run `probing {pid} inject`, to start a new agent in it"
)


def _quiet(message: str) -> None:
    pass


def _read_argument(value: str, what: str) -> str:
    """`-` means: read it from standard input (for code or SQL with quotes and newlines)."""
    text = sys.stdin.read() if value == "-" else value
    if not text.strip():
        raise UsageError(f"empty {what}")
    return text


# How long the agent may be silent before a look from outside decides whether to wait on.
EARLY_LOOK_S = 0.3


class Fallback(Exception):
    """The agent cannot answer: read the stacks from outside instead, and say why.
    `unreachable`: the agent went away (closed the connection), rather than stayed silent."""

    def __init__(self, why: str, unreachable: bool = False) -> None:
        super().__init__(why)
        self.unreachable = unreachable


def _ask(client: Client, method: str, params: Dict[str, Any], timeout: float, pid: Optional[int]) -> Any:
    """One request that gives up early: when the agent is silent for a moment and a look from
    outside shows a thread holding the GIL, waiting on would only waste the budget."""
    from ..errors import AgentTimeout, AgentUnreachable

    deadline = time.monotonic() + timeout
    try:
        client.send(method, params)
        if not client.answered(min(EARLY_LOOK_S, deadline - time.monotonic())):
            holder = _gil_holder(pid) if pid else None
            if holder is not None:
                raise Fallback(holder)
            if not client.answered(deadline - time.monotonic()):
                raise Fallback(f"the agent did not answer within {timeout:g} s")
        return client.receive(method, max(1.0, deadline - time.monotonic()))
    except (AgentTimeout, AgentUnreachable) as error:
        raise Fallback(error.message, isinstance(error, AgentUnreachable)) from None


def _backtrace_from_agent(
    context: Context, params: Dict[str, Any], timeout: float
) -> Tuple[Any, Dict[str, Any]]:
    from ..errors import AgentTimeout, AgentUnreachable, AttachFailed, AttachTimeout

    started = time.monotonic()
    try:
        client = context.connect(timeout, attach_budget=timeout, give_up_early=True, reattach=False)
    except (AttachTimeout, AttachFailed, AgentTimeout, AgentUnreachable) as error:
        raise Fallback(error.message) from None
    with client:
        remaining = max(0.5, timeout - (time.monotonic() - started))
        result, payload = _ask(client, "backtrace", params, remaining, parse_target(context.target).pid)
        return decode_reply_table(result, payload), client.info


# The look from outside that decided to fall back, reused for the answer itself.
_last_look: Dict[int, Any] = {}


def _gil_holder(pid: int) -> Optional[str]:
    from ..outside.pyspy import dump, gil_holder

    try:
        threads = dump(pid, timeout=1.0)
    except ProbingError:
        return None
    _last_look[pid] = (time.monotonic(), threads)
    return gil_holder(threads)


def _backtrace_from_outside(
    pid: int, native: bool, thread: Optional[str], why: Optional[str]
) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    from ..client.discovery import python_version_of
    from ..errors import AgentTimeout
    from ..outside.pyspy import OutsideView, gil_holder, look, rows_from_dump

    try:
        taken, threads = _last_look.pop(pid, (0.0, None))
        if threads is not None and not native and time.monotonic() - taken < 0.5:
            view = OutsideView(rows_from_dump(pid, threads), gil_holder(threads), threads)
        else:
            view = look(pid, native=native)
    except ProbingError as error:
        if why is None:
            raise
        raise AgentTimeout(f"{why}; {error.message}") from None
    rows = view.rows
    if thread:
        rows = [
            row
            for row in rows
            if thread in (row["thread_name"], str(row["thread_id"]), str(row["native_id"]))
        ]
        if not rows:
            names = ", ".join(
                dict.fromkeys(f"{row['thread_name']} ({row['thread_id']})" for row in view.rows)
            )
            raise ProbingError(f"no thread named or numbered {thread!r}; threads: {names}")
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = [os.fsdecode(part) for part in cmdline.read().split(b"\0") if part]
    except OSError:
        argv = []
    outside = {thread.get("os_thread_id"): thread for thread in view.threads}
    return rows, {"pid": pid, "python_version": python_version_of(pid), "argv": argv[1:], "outside": outside}


def _one_process(
    context: Context, locals: bool, thread: Optional[str], timeout: float, native: bool
) -> Tuple[List[Dict[str, Any]], Dict[str, Any], Optional[str]]:
    """(rows, process info, a note for the user) for one process: from its agent, or from
    outside when the agent cannot answer (or when --native asks for native frames)."""
    target = parse_target(context.target)
    if native:
        # Native frames are not visible from inside Python: py-spy reads them from outside.
        if target.pid is None:
            raise UsageError("--native reads the process from outside: give its PID, not a socket")
        rows, info = _backtrace_from_outside(target.pid, True, thread, None)
        return rows, info, None
    try:
        table, info = _backtrace_from_agent(context, {"locals": locals, "thread": thread}, timeout)
        return table.to_rows(), info, None
    except NoAgent:
        if target.pid is None or not context.no_attach:
            raise
        why = "no agent"
    except Fallback as fallback:
        if target.pid is None:
            raise ProbingError(str(fallback)) from None
        why = str(fallback)
    rows, info = _backtrace_from_outside(target.pid, False, thread, why)
    return rows, info, f"{why}; answered from outside the process (py-spy)"


def _descendants(pid: int) -> List[Tuple[int, str]]:
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for child in children:
        try:
            found.append((child.pid, " ".join(child.cmdline())))
        except psutil.Error:
            continue
    return found


def backtrace(
    context: Context,
    locals: bool,
    thread: Optional[str],
    format: str,
    timeout: float,
    native: bool = False,
    children: bool = False,
    attach_children: bool = False,
) -> int:
    target = parse_target(context.target)
    processes: List[Tuple[Context, Optional[str]]] = [(context, None)]
    if children or attach_children:
        if target.pid is None:
            raise UsageError("--children needs the PID of the parent process")
        # Descendants without an agent are read from outside unless --attach-children:
        # attaching to every DataLoader worker would be slow and intrusive.
        for child, child_command in _descendants(target.pid):
            child_context = Context(str(child), context.verbose, not attach_children, context.attach_timeout)
            processes.append((child_context, child_command))
    results = []
    for process_context, command in processes:
        try:
            results.append(
                _one_process(process_context, locals, thread if command is None else None, timeout, native)
            )
        except ProbingError as error:
            if command is None:
                raise
            # A descendant that is not Python (a shell, a compiler), or that just exited.
            render.note(f"PID {process_context.target} ({command}): {error.message}")
    for _, info, note in results:
        if note is not None:
            render.note(f"PID {info.get('pid')}: {note}")
    sys.stderr.flush()
    if format == "text":
        for index, (rows, info, _) in enumerate(results):
            if index:
                sys.stdout.write("\n")
            pid = target.pid if index == 0 else rows[0]["pid"] if rows else info.get("pid")
            render.write_backtrace_text(rows, info, sys.stdout, pid, info.get("outside"))
    else:
        from ..schema.tables import BACKTRACE

        names = [column.name for column in BACKTRACE.columns]
        types = [column.type for column in BACKTRACE.columns]
        every = [tuple(row[name] for name in names) for rows, _, _ in results for row in rows]
        render.write_rows(names, types, every, format, sys.stdout)
    return ExitCode.OK


def hang(context: Context, duration: float, samples: int, format: str, timeout: float) -> int:
    from ..analysis.progress import Sample, stuck_dataloader_worker, take_sample, watch
    from ..outside.pyspy import dump, rows_from_dump

    target = parse_target(context.target)
    if target.pid is None:
        raise UsageError("hang needs the PID of the process")
    pid = target.pid
    notes: List[str] = []

    def sample() -> Sample:
        rows, info, note = _one_process(context, False, None, timeout, False)
        if note and note not in notes:
            notes.append(note)
        return take_sample(pid, rows, info)

    sources = render.SourceLines(pid)
    report = watch(pid, sample, duration, samples, lambda frame: sources.line(frame["file"], frame["lineno"]))
    worker_rows: Dict[int, List[Dict[str, Any]]] = {}
    commands: Dict[int, str] = {}
    main = next((thread for thread in report.threads if thread.is_main), None)
    if main is not None and main.state == "waiting for a DataLoader worker":
        for child, command in _descendants(pid):
            commands[child] = command
            try:
                worker_rows[child] = rows_from_dump(child, dump(child, locals=True))
            except ProbingError:
                continue
        report = report._replace(worker=stuck_dataloader_worker(worker_rows))
    for note in notes:
        render.note(note)
    if format == "json":
        import json

        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        render.write_hang(report, sys.stdout)
        if report.worker is not None:
            from ..client.discovery import python_version_of

            worker = report.worker["pid"]
            # Locals of the innermost frames and of __getitem__ only (the index, the path being
            # read), as the CI watchdog shows them: every frame's locals would bury them.
            rows = [
                dict(row, locals=row["locals"] if row["depth"] == 0 or row["func"] == "__getitem__" else None)
                for row in worker_rows[worker]
            ]
            info = {"pid": worker, "python_version": python_version_of(worker),
                    "argv": commands.get(worker, "").split()[1:]}  # fmt: skip
            render.write_backtrace_text(rows, info, sys.stdout, worker)
    return ExitCode.HUNG if report.hung else ExitCode.OK


def evaluate(context: Context, code: str, frame: Optional[str], timeout: float, force: bool = False) -> int:
    from ..client.connection import decode_reply_texts

    source = _read_argument(code, "code")
    with context.connect(min(timeout, 5.0)) as client:
        params: Dict[str, Any] = {"code": source, "frame": frame, "timeout": timeout}
        if force:
            params["allow_exit"] = True
        result, payload = client.call("eval", params, timeout=timeout + EVAL_REPLY_GRACE_S)
    result = decode_reply_texts(result, payload)  # output, value: as large as they came
    render.write_eval_result(result, sys.stdout, sys.stderr)
    return ExitCode.OK


# Beyond --step-wait, what a torch table may take to install its step hook on first use.
STEP_HOOK_INSTALL_S = 1.0


def query(
    context: Context, sql: str, format: str, timeout: float, scan_budget: float = 1.0, step_wait: float = 1.0
) -> int:
    from ..engine.process_tables import LOCAL_TABLES
    from ..errors import AgentTimeout, AgentUnreachable, AttachFailed, AttachTimeout
    from ..sql.session import SqlSession

    text = _read_argument(sql, "SQL")
    target = parse_target(context.target)
    session = _static_session()
    wanted = session.referenced_tables(text)
    local = [name for name in wanted if name in LOCAL_TABLES]
    pid = target.pid
    if target.pid is None or not wanted or len(local) < len(wanted):
        try:
            with context.connect(timeout, attach_budget=timeout, give_up_early=True) as client:
                described, _ = _ask(client, "tables", {}, timeout, target.pid)
                session = SqlSession(described["tables"] + _local_described())
                pid = pid or client.info.get("pid")  # ours: the agent's may be a container's
                for name in session.referenced_tables(text):
                    if name in LOCAL_TABLES:
                        continue
                    context.log(f"fetching {name}")
                    params = {"scan_budget_s": scan_budget, "step_wait_s": step_wait}
                    wait = timeout + scan_budget + step_wait + STEP_HOOK_INSTALL_S
                    table = client.fetch_table(name, params, wait)
                    for note in table.notes:
                        render.note(note)
                    session.load(table)
        except (AgentTimeout, AgentUnreachable, AttachFailed, AttachTimeout) as error:
            # A query over python.backtrace (and process.stats) is answered from outside.
            session = _outside_session(context, text, error.message, isinstance(error, AgentUnreachable))
        except Fallback as fallback:
            session = _outside_session(context, text, str(fallback), fallback.unreachable)
    for name in local:
        from ..engine.process_tables import build_local_table

        context.log(f"reading {name} with psutil")
        _load_builder(session, build_local_table(name, pid or 0))
    result = session.run(text)
    render.write_rows(result.columns, result.types, result.rows, format, sys.stdout)
    return ExitCode.OK


def memory(
    context: Context, growth: Optional[float], cuda_snapshot: Optional[str], interval: Optional[float],
    top: int, format: str, timeout: float, scan_budget: float,
) -> int:  # fmt: skip
    params: Dict[str, Any] = {"top": top, "scan_budget_s": scan_budget}
    wait = timeout + scan_budget
    if growth is not None:
        params.update(action="growth", seconds=growth)
        wait = growth + 2 * scan_budget + timeout  # the window, two object scans, the rest
    elif cuda_snapshot is not None:
        params["action"] = "cuda_snapshot"
    elif interval is not None:
        params.update(action="interval", interval_s=interval)
    else:
        params["action"] = "summary"
    # The PID as this side sees it: the agent's own may be another PID namespace's (a container).
    pid = parse_target(context.target).pid
    with context.connect(min(timeout, 10.0)) as client:
        result, payload = client.call("memory", params, timeout=wait)
        pid = pid or client.info.get("pid")
        result["pid"] = pid
        command = " ".join(client.info.get("argv") or [])
    from . import memory_report

    if cuda_snapshot is not None:
        with open(cuda_snapshot, "wb") as handle:
            handle.write(payload)
        memory_report.write_cuda_snapshot(result, cuda_snapshot, sys.stdout)
        return ExitCode.OK
    if params["action"] == "summary":
        result["outside"] = _outside_memory(int(pid or 0))
    if format == "json":
        import json

        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    elif params["action"] == "growth":
        memory_report.write_growth(
            result, render.SourceLines(int(result["pid"])), render.inert_stream(sys.stdout)
        )
    elif params["action"] == "interval":
        memory_report.write_sampler(result, render.inert_stream(sys.stdout))
    else:
        memory_report.write_memory(result, command, render.inert_stream(sys.stdout))
    for note in result.get("notes") or ():
        render.note(note)
    return ExitCode.OK


def _outside_memory(pid: int) -> Dict[str, Any]:
    """USS, PSS and swap from /proc/PID/smaps (psutil): what the process alone holds."""
    import psutil

    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.Error, OSError) as error:
        return {"error": f"{type(error).__name__}: {error}"}
    mb = 1024.0 * 1024.0
    return {"uss_mb": info.uss / mb, "pss_mb": info.pss / mb, "swap_mb": info.swap / mb}


def _local_described() -> List[Dict[str, Any]]:
    from ..engine.process_tables import local_tables_described

    return local_tables_described()


def _static_session() -> Any:
    """A session with the tables this CLI knows (the agent's own list may differ by version)."""
    from ..schema.tables import AGENT_TABLES as TABLES
    from ..sql.session import SqlSession

    return SqlSession([table.describe() for table in TABLES.values()] + _local_described())


def _load_builder(session: Any, builder: Any) -> None:
    descriptor, chunks = builder.encode()
    session.load(decode_table(descriptor, bytearray(b"".join(bytes(chunk) for chunk in chunks))))


def _outside_session(context: Context, text: str, why: str, unreachable: bool = False) -> Any:
    """A session over python.backtrace read from outside; other tables cannot be, and the
    error says why the agent did not give them: it went away (exit 1) or stayed silent (7)."""
    from ..engine.process_tables import LOCAL_TABLES
    from ..errors import AgentTimeout, AgentUnreachable
    from ..schema.tables import BACKTRACE

    pid = parse_target(context.target).pid
    session = _static_session()
    wanted = session.referenced_tables(text)
    if (
        pid is None
        or BACKTRACE.name not in wanted
        or any(name != BACKTRACE.name and name not in LOCAL_TABLES for name in wanted)
    ):
        failure = AgentUnreachable if unreachable else AgentTimeout
        raise failure(
            why, hint="only queries over python.backtrace (and process.stats) can be answered from outside"
        )
    rows, _ = _backtrace_from_outside(pid, False, None, why)
    from ..agent.columns import TableBuilder

    builder = TableBuilder(BACKTRACE.name, BACKTRACE.column_types())
    for row in rows:
        builder.append(tuple(row[column.name] for column in BACKTRACE.columns))
    _load_builder(session, builder)
    render.note(f"{why}; python.backtrace read from outside the process (py-spy)")
    return session


def switch(context: Context, feature: str, params: Dict[str, Any], format: str, timeout: float) -> int:
    """trace / nan: turn a torch feature of the agent on or off, or report on it."""
    with context.connect(timeout) as client:
        result, _ = client.call(feature, params)
        pid = client.info.get("pid")
    if format == "json":
        import json

        sys.stdout.write(json.dumps(dict(result["status"], pid=pid, hooks_before=result["hooks_before"],
                                         hooks_after=result["hooks_after"])) + "\n")  # fmt: skip
    else:
        render.write_switch(feature, params["action"], pid, result, sys.stdout)
    return ExitCode.OK


def tables(context: Context, format: str, timeout: float) -> int:
    with context.connect(timeout) as client:
        described = client.describe_tables() + _local_described()
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
    try:
        socket_path = target.socket or locate_socket(target.pid or 0, context.log)
        client = Client(socket_path, timeout, context.log, pid=target.pid)
    except NoAgent as error:
        from ..attach.liveness import stopped_agent

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
    sys.stdout.write(f"PID {pid}: agent stopped (threads, hooks and socket removed); the job runs on\n")
    return ExitCode.OK


def list_processes(format: str) -> int:
    from ..engine.listing import python_processes

    found = python_processes()
    columns = ["pid", "user", "python", "agent", "command"]
    types = ["BIGINT", "VARCHAR", "VARCHAR", "BOOLEAN", "VARCHAR"]
    rows = [(p.pid, p.user, p.python_version, p.agent, p.command) for p in found]
    render.write_rows(columns, types, rows, format, sys.stdout)
    return ExitCode.OK


def run(
    command: List[str], verbose: bool, hang_timeout: Optional[float] = None, report: Optional[str] = None
) -> int:
    from ..launch.launcher import Launcher

    if not command:
        raise UsageError("nothing to run: probing run -- python train.py")
    launcher = Launcher(command)
    child = launcher.start()
    sys.stderr.write(f"probing: started PID {child.pid}: {' '.join(command)}\n")
    sys.stderr.flush()
    if hang_timeout is None:
        return launcher.wait()
    from ..launch.watchdog import Watchdog

    watchdog = Watchdog(child.pid, hang_timeout, report, Context(str(child.pid), verbose, True, 5.0))
    return launcher.wait(watchdog.tick, watchdog.interval)
