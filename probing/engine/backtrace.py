"""The stacks of one process: from its agent, or from outside (py-spy) when the agent cannot
answer, with the reason as a note.

The fallback policy: ask the agent; when it has been silent for EARLY_LOOK_S, or sooner while no
thread of the process runs at all, look from outside. A thread seen holding the GIL means the
agent cannot answer until that thread lets go, so waiting on would only waste the budget: the
look itself becomes the answer. Otherwise the agent gets the rest of the timeout. py-spy runs
only when the agent is late or the job is stuck, so a healthy job is never read from outside.

How a command's --timeout T is split (docs/decisions.md, "What --timeout covers"): attaching
gets at most min(--attach-timeout, T); the agent gets T from its request, and the look from
outside made within it gets what is left of T; a read from outside gets T of its own. Every
read from outside gets at least pyspy.OUTSIDE_FLOOR_S, and says which deadline passed.

Standard library only at import time (the fast path of `probing PID backtrace`).
"""

from __future__ import annotations

import os
import time

from ..analysis.asyncio_tasks import runs_loop
from ..client.connection import Client
from ..client.replies import decode_reply_table
from ..errors import AgentTimeout, AgentUnreachable, NoAgent, ProbingError, UsageError
from ..procfs import command_line
from .jobs.fanout import Gathered
from .shown import ShownThread, shown_threads
from .sources import SourceLines
from .target import REMOTE_HINT, STILL_CHECK_S, Fallback, Stillness, why_from_outside

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

    from ..schema.rows import AsyncioTasksRow, BacktraceRow
    from .jobs.job import Rank
    from .target import Target

# How long the agent may be silent before a look from outside decides whether to wait on.
EARLY_LOOK_S = 0.3
# Set by the native front end (native/front/agent.c) to the PID whose agent it has already given
# EARLY_LOOK_S, in vain, with a thread of it running: that wait is not made twice.
AGENT_SILENT = "PROBING_AGENT_SILENT"


class Stacks:
    """python.backtrace rows of one process, what is known of the process (`info`: pid,
    python_version, argv, and `outside`: py-spy's threads by native id when read from
    outside), and notes for the user (why the answer came from outside). `sources`: whose
    files the source lines are read as (default: the process's own, engine/sources.py).
    `tasks`: python.asyncio_tasks rows, read where a thread runs an asyncio loop."""

    __slots__ = ("pid", "rows", "info", "notes", "sources", "tasks", "_threads")

    def __init__(
        self, pid: Optional[int], rows: List[BacktraceRow], info: Dict[str, Any], notes: List[str],
        sources: Optional[SourceLines] = None,
    ) -> None:  # fmt: skip
        self.pid = pid  # as this side sees it: the agent's own may be another PID namespace's
        self.rows = rows
        self.info = info
        self.notes = notes
        self.sources = sources
        self.tasks: List[AsyncioTasksRow] = []
        self._threads: Optional[List[ShownThread]] = None

    @property
    def threads(self) -> List[ShownThread]:
        """The threads as a traceback shows them (engine/shown.py), worked out from `rows` on
        first use: an answer printed as rows (JSON, CSV) reads no source file."""
        if self._threads is None:
            sources = self.sources
            if sources is None:
                # A PID given as text (a record's, a core's) may be another process's by now.
                own = self.info.get("pid")
                sources = SourceLines(self.pid or (own if isinstance(own, int) else None))
            self._threads = shown_threads(self.rows, sources, self.info.get("outside"), self.tasks)
        return self._threads


def backtrace_reply_rows(result: Any, payload: Any) -> List[BacktraceRow]:
    """The python.backtrace rows of an agent's reply, typed as the schema has them: decoding
    refused a table whose columns have other types (client/replies.py)."""
    return decode_reply_table(result, payload).to_rows()  # type: ignore[return-value]


def ask(client: Client, method: str, params: Dict[str, Any], timeout: float, target: Target) -> Any:
    """One request that gives up early (Fallback) when the agent stays silent and a look from
    outside shows a thread holding the GIL, or when the agent times out or goes away."""

    deadline = time.monotonic() + timeout
    early_look = 0.0 if os.environ.pop(AGENT_SILENT, None) == str(target.pid) else EARLY_LOOK_S
    try:
        client.send(method, params)
        if not _answered_or_stuck(client, target, min(early_look, timeout)):
            holder = target.gil_holder(deadline - time.monotonic())
            if holder is not None:
                raise Fallback(holder)
            if not client.answered(deadline - time.monotonic()):
                raise Fallback(f"the agent did not answer within {timeout:.3g} s")
        return client.receive(method, max(1.0, deadline - time.monotonic()))
    except (AgentTimeout, AgentUnreachable) as error:
        raise Fallback(error.message, isinstance(error, AgentUnreachable)) from None


def _answered_or_stuck(client: Client, target: Target, wait: float) -> bool:
    """Wait up to `wait` seconds for the agent's reply: True once it starts arriving, False when
    the wait ends or, sooner, when the process is found stuck on its GIL (target.Stillness).
    py-spy then looks; a healthy job is never found stuck, so it is not read from outside any
    sooner than after EARLY_LOOK_S, as before."""
    end = time.monotonic() + wait
    stillness = Stillness(target.pid)
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return False
        if client.answered(min(STILL_CHECK_S, left)):
            return True
        why = stillness.check()
        if why is not None:
            target.log(f"the agent is silent and {why}: looking from outside")
            return False


def _connect_local(target: Target, timeout: float) -> Client:
    from ..errors import AttachFailed, AttachTimeout

    try:
        return target.connect(timeout, attach_budget=timeout, give_up_early=True, reattach=False)
    except (AttachTimeout, AttachFailed, AgentTimeout, AgentUnreachable) as error:
        raise Fallback(error.message) from None


def _from_agent(target: Target, params: Dict[str, Any], timeout: float) -> Stacks:
    started = time.monotonic()
    if target.remote:
        # Nothing to fall back on over TCP: the error as it is, naming the endpoint.
        client = target.connect(timeout)
    else:
        client = _connect_local(target, timeout)
    with client:
        remaining = max(0.5, timeout - (time.monotonic() - started))
        result, payload = ask(client, "backtrace", params, remaining, target)
        rows = backtrace_reply_rows(result, payload)
        # An endpoint's PID is its own machine's: here it may be any process's, root's too, and
        # the job names the files. Its source lines are read as nobody's (world-readable only).
        sources = SourceLines(None) if target.remote else None
        stacks = Stacks(target.pid or client.info.get("pid"), rows, dict(client.info), [], sources)
        if runs_loop(rows):
            left = max(0.5, timeout - (time.monotonic() - started))
            stacks.tasks, stacks.notes = loop_tasks_of(client, left)
        return stacks


def loop_tasks_of(client: Client, timeout: float) -> Tuple[List[AsyncioTasksRow], List[str]]:
    """python.asyncio_tasks from an agent, with its notes (what was cut); none, and why, from
    an agent that cannot say (an older one, or one that failed)."""
    from ..schema.tables import ASYNCIO_TASKS

    try:
        table = client.fetch_table(ASYNCIO_TASKS.name, timeout=timeout)
    except ProbingError as error:
        return [], [f"the asyncio tasks could not be read: {error.message}"]
    # Typed as the schema has them: decoding refused other column types (client/replies.py).
    return table.to_rows(), table.notes  # type: ignore[return-value]


def _only_thread(rows: List[BacktraceRow], thread: str) -> List[BacktraceRow]:
    chosen = [
        row for row in rows if thread in (row["thread_name"], str(row["thread_id"]), str(row["native_id"]))
    ]
    if not chosen:
        names = ", ".join(dict.fromkeys(f"{row['thread_name']} ({row['thread_id']})" for row in rows))
        raise ProbingError(f"no thread named or numbered {thread!r}; threads: {names}")
    return chosen


def from_outside(
    target: Target, native: bool, thread: Optional[str], why: Optional[str], timeout: float
) -> Stacks:
    """The stacks read with py-spy within `timeout` (the command's --timeout: the read gets
    pyspy.outside_budget of it); `why` the agent did not give them (None: not asked)."""
    from ..client.discovery import python_version_of
    from ..outside.pyspy import OutsideView, gil_holder, look, rows_from_dump

    pid = target.require_pid("reading the stacks from outside")
    try:
        threads = None if native else target.fresh_look()
        if threads is not None:
            view = OutsideView(rows_from_dump(pid, threads), gil_holder(threads), threads)
        else:
            view = look(pid, native, timeout)
    except ProbingError as error:
        if why is None:
            raise
        raise AgentTimeout(f"{why}; {error.message}", hint=error.hint or "") from None
    rows = _only_thread(view.rows, thread) if thread else view.rows
    outside = {each.get("os_thread_id"): each for each in view.threads}
    info = {
        "pid": pid,
        "python_version": python_version_of(pid),
        "argv": command_line(pid)[1:],
        "outside": outside,
    }
    notes = [] if why is None else [f"{why}; answered from outside the process (py-spy)"]
    if native:
        from ..outside.symbols import native_notes

        notes += native_notes(pid, view.threads)
    return Stacks(pid, rows, info, notes)


def read_stacks(
    target: Target, locals: bool, thread: Optional[str], timeout: float, native: bool = False
) -> Stacks:
    """The stacks of one process: from its agent, or from outside when the agent cannot answer
    (or when `native` asks for native frames, which only py-spy reads)."""
    if native:
        if target.remote:
            raise UsageError(f"--native reads the process from outside: {REMOTE_HINT}")
        if target.pid is None:
            raise UsageError("--native reads the process from outside: give its PID, not a socket")
        return from_outside(target, True, thread, None, timeout)
    try:
        return _from_agent(target, {"locals": locals, "thread": thread}, timeout)
    except (NoAgent, Fallback) as error:
        why = why_from_outside(target, error)
    return from_outside(target, False, thread, why, timeout)


def stacks_deadline(timeout: float, attach_timeout: float) -> float:
    """The longest `read_stacks` with this --timeout takes: attaching, the agent's share (with
    the look from outside that decides whether to wait on, given at least the floor), then a
    read from outside (the module's docstring)."""
    from ..outside.pyspy import OUTSIDE_FLOOR_S, outside_budget

    return attach_timeout + max(timeout, EARLY_LOOK_S + OUTSIDE_FLOOR_S) + outside_budget(timeout)


def read_stacks_of_ranks(
    ranks: List[Rank], target_of: Callable[[Rank], Target], locals: bool, thread: Optional[str],
    timeout: float, deadline: float, native: bool = False,
) -> Gathered:  # fmt: skip
    """Every rank's stacks. One request goes to each rank's agent at once and the answers are
    read as they come, in this thread: a job whose agents answer (the usual case) needs no
    thread, and its ranks answer in about the time of the slowest. A rank without an agent, or
    whose agent is not quick (silent for EARLY_LOOK_S, or stuck on its GIL: no thread of it
    runs), is read the full way (`read_stacks`: attach, the look from outside) in a thread of its own."""
    from ..client.discovery import locate_socket

    params = {"locals": locals, "thread": thread}
    asked: List[Tuple[Rank, Client]] = []
    full: List[Rank] = []
    for rank in ranks:
        # Native frames come from outside; a gone rank is reported; a rank on another node is
        # read in a thread of its own: its connect and handshake may take the whole timeout (a
        # frozen node), which must not add up rank after rank here.
        if native or not rank.pid or rank.remote:
            full.append(rank)
            continue
        target = target_of(rank)
        try:
            client = Client(locate_socket(rank.pid, target.log), timeout, target.log, pid=rank.pid)
        except ProbingError:
            full.append(rank)
            continue
        try:
            client.send("backtrace", params)
        except ProbingError:
            client.close()
            full.append(rank)
            continue
        asked.append((rank, client))
    quick: List[Tuple[Rank, Any]] = []
    # As long as one target's agent gets before a look from outside (EARLY_LOOK_S), but a rank
    # found stuck on its GIL is handed on at once.
    end = time.monotonic() + EARLY_LOOK_S
    for rank, client in asked:
        with client:
            stillness = Stillness(rank.pid)
            try:
                while not client.answered(min(STILL_CHECK_S, max(0.0, end - time.monotonic()))):
                    if time.monotonic() >= end or stillness.check() is not None:
                        raise Fallback("not quick")
                result, payload = client.receive("backtrace", timeout)
                stacks = Stacks(rank.pid, backtrace_reply_rows(result, payload), dict(client.info), [])
            except (ProbingError, Fallback):
                full.append(rank)
                continue
            if runs_loop(stacks.rows):  # its tasks, as `_from_agent` reads them
                stacks.tasks, stacks.notes = loop_tasks_of(client, timeout)
        quick.append((rank, stacks))
    if not full:
        return Gathered(quick, [])
    from .jobs.fanout import gather

    rest = gather(full, lambda rank: read_stacks(target_of(rank), locals, thread, timeout, native), deadline)
    return Gathered(sorted(quick + rest.answers, key=lambda pair: pair[0].rank), rest.missing)


class TreeStacks:
    """Stacks of a process and of its descendants; `failed` holds (pid, command, error) for
    each descendant that could not be read (not Python, or gone)."""

    __slots__ = ("processes", "failed")

    def __init__(self) -> None:
        self.processes: List[Stacks] = []
        self.failed: List[Any] = []


def read_tree(
    target: Target,
    locals: bool,
    thread: Optional[str],
    timeout: float,
    native: bool = False,
    children: bool = False,
    attach_children: bool = False,
) -> TreeStacks:
    """The stacks of the target and, with `children`, of every descendant. Descendants without
    an agent are read from outside unless `attach_children`: attaching to every DataLoader
    worker would be slow and intrusive."""
    tree = TreeStacks()
    related = []
    if children or attach_children:
        from .processes import descendants  # psutil: only when asked for

        pid = target.require_pid("--children")
        related = [
            (target.related(child, not attach_children), command) for child, command in descendants(pid)
        ]
    tree.processes.append(read_stacks(target, locals, thread, timeout, native))
    for child, command in related:
        try:
            tree.processes.append(read_stacks(child, locals, None, timeout, native))
        except ProbingError as error:
            # A descendant that is not Python (a shell, a compiler), or that just exited.
            tree.failed.append((child.pid, command, error))
    return tree
