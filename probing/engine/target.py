"""One target to inspect: a PID, the path of an agent's socket, or a remote agent's
tcp://HOST:PORT, and how to reach its agent.

A `Target` holds everything about one process that a command needs between its steps (the
options, the last look from outside) and nothing global, so that many of them can work side by
side, one per rank, each in its own thread. It never prints: what it did goes to its `log`
(the CLI's -v), and what the user should know comes back as notes with the answer.

Standard library only at import time: `probing PID backtrace` goes through here (cli/fast.py).
"""

from __future__ import annotations

import os
import stat
import time

from ..client.connection import TCP_SCHEME, Client
from ..client.discovery import locate_socket
from ..errors import AgentTimeout, AgentUnreachable, NoAgent, NotLive, ProbingError, UsageError
from ..procfs import running_threads
from ..protocol.records import SUFFIX as RECORD_SUFFIX
from .jobs.job import STALE_ENDPOINT_HINT, NotTheRank, Rank, identity_mismatch
from .records.path import FATAL_SUFFIX, is_record_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple, Union

    Log = Callable[[str], None]

# A socket given as the target is only ever connected to: --no-attach has nothing to do with it.
SOCKET_TARGET_HINT = (
    "give the job's PID instead of its socket: probing attaches to a process that has no agent"
)
STOPPED_AGENT_HINT = (
    "code in the job closed the agent's socket (a job closing its descriptors, or an eval); "
    "drop --no-attach, or run `probing {pid} inject`, to start a new agent in it"
)
# What a remote rank (tcp://) cannot have: attach, py-spy and /proc need the process itself.
REMOTE_HINT = "reading from outside works only on the rank's own node"
# How long a look from outside (py-spy) stays fresh enough to answer with.
LOOK_FRESH_S = 0.5
# While the agent is silent (or its queue of connections full): how often the process's threads
# are looked at, and how many looks in a row finding none running say it is stuck (Stillness).
STILL_CHECK_S = 0.001
STILL_CHECKS = 2


def quiet(message: str) -> None:
    pass


class Fallback(Exception):
    """The agent cannot answer: read from outside instead, and say why.
    `unreachable`: the agent went away (closed the connection), rather than stayed silent."""

    def __init__(self, why: str, unreachable: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.unreachable = unreachable


def why_from_outside(target: Target, error: Union[ProbingError, Fallback]) -> str:
    """The one policy of every command that can answer from outside (py-spy) when the agent
    cannot (backtrace, flamegraph): why it will, or the error to raise instead. An agent that
    is silent or gone (Fallback) falls back, and a process without one under --no-attach
    (NoAgent); a remote rank (tcp://) has no outside to fall back on here, nor has a socket
    given as the target (no PID); any other error is raised as it is."""
    if isinstance(error, Fallback):
        if target.remote:
            failure = AgentUnreachable if error.unreachable else AgentTimeout
            raise failure(f"{error.why}; {REMOTE_HINT}", hint="") from None
        if target.pid is None:
            raise ProbingError(error.why) from None
        return error.why
    if isinstance(error, NoAgent) and target.pid is not None and target.no_attach:
        return "no agent"
    raise error


def parse_address(text: Optional[str]) -> Tuple[Optional[int], Optional[str]]:
    """(pid, socket path or tcp:// endpoint) of a TARGET as the user wrote it; exactly one is set."""
    if text is None:
        raise UsageError("this command needs a target: probing PID COMMAND (or -t PID)")
    if text.startswith(TCP_SCHEME):
        from ..client.tcp import endpoint_url, split_endpoint

        return None, endpoint_url(*split_endpoint(text))
    if text.isdigit():
        return int(text), None
    try:
        if stat.S_ISSOCK(os.stat(text).st_mode):
            return None, text
    except OSError:
        pass
    if is_record_path(text):
        # Whatever asks for a process to reach (a Target) cannot have a record: see engine/records/record.py.
        raise NotLive(f"{text} is a record of a job that has ended: this needs a live process")
    host, _, port = text.rpartition(":")
    if host and port.isdigit() and os.sep not in text and not os.path.exists(text):
        # HOST:PORT as the anchor tool writes it: a PID is digits and a path exists, so no
        # other reading of it is possible.
        from ..client.tcp import endpoint_url, split_endpoint

        return None, endpoint_url(*split_endpoint(text))
    if _names_a_file(text) and not os.path.lexists(text):
        record = text.endswith((RECORD_SUFFIX, FATAL_SUFFIX))
        raise UsageError(f"no such file: {text}", hint=_RECORDS_HINT if record else "")
    raise UsageError(
        "TARGET must be a PID, the path of an agent socket, HOST:PORT, tcp://HOST:PORT, a record "
        f"file or a core file, not {text!r}"
    )


_RECORDS_HINT = "`probing records` lists the records jobs left on this machine"


def _names_a_file(text: str) -> bool:
    """Whether a TARGET can only be read as a path: a directory in it, or a record's or a socket's
    name (no PID, host or endpoint looks like one)."""
    return os.sep in text or text.endswith((RECORD_SUFFIX, FATAL_SUFFIX, ".sock"))


class Stillness:
    """Whether a process whose agent does not answer is stuck on its GIL.

    An agent needs the GIL to answer, and a running holder lets go of it within a switch
    interval (5 ms). So when no thread of the process runs (state R) or does I/O (state D) in
    STILL_CHECKS looks in a row, whoever holds the GIL is blocked holding it (a C call that
    sleeps or waits), and waiting on is pointless. A healthy job always has a thread running
    while its agent waits for the GIL, or its agent answers at once: it is never found still.
    """

    __slots__ = ("pid", "still", "looked_at")

    def __init__(self, pid: Optional[int]) -> None:
        self.pid = pid
        self.still = 0
        self.looked_at = 0.0

    def check(self) -> Optional[str]:
        """Why waiting on is pointless, or None while it may not be (or cannot be told)."""
        now = time.monotonic()
        if self.pid is not None and now - self.looked_at >= STILL_CHECK_S:
            self.looked_at = now
            running = running_threads(self.pid)
            self.still = self.still + 1 if running == 0 else 0
        if self.still < STILL_CHECKS:
            return None
        return f"no thread of PID {self.pid} runs: the GIL is held by a thread that is blocked"


class Target:
    """One process to inspect, named by PID, by its agent's socket or by a remote agent's
    tcp://HOST:PORT (`remote`: nothing is done to the process itself, only asked of its agent).

    `log` narrates each step (socket, attach, timings); `no_attach` refuses to put an agent
    into a process that has none; `attach_timeout` bounds the wait for one that was put in.
    `rank`: the rank of a job a remote target must be; its agent's hello is checked before any
    request goes to it (a stale registry entry's port may be another agent's now).
    """

    def __init__(
        self,
        text: Optional[str],
        log: Optional[Log] = None,
        no_attach: bool = False,
        attach_timeout: float = 5.0,
        rank: Optional[Rank] = None,
    ) -> None:
        self.text = text
        self.rank = rank
        self.pid, self.socket = parse_address(text)
        self.remote = self.socket is not None and self.socket.startswith(TCP_SCHEME)
        self.log: Log = log or quiet
        self.no_attach = no_attach
        self.attach_timeout = attach_timeout
        # The look from outside that decided to fall back, reused for the answer itself:
        # (when it was taken, py-spy's threads).
        self._look: Optional[Tuple[float, List[Dict[str, Any]]]] = None

    def __repr__(self) -> str:
        return f"Target({self.text!r})"

    def related(self, pid: int, no_attach: bool) -> Target:
        """Another process of the same job (a descendant), with the same options."""
        return Target(str(pid), self.log, no_attach, self.attach_timeout)

    def require_pid(self, what: str) -> int:
        """The PID, for what can only be done to a process (read from outside, attach)."""
        if self.remote:
            raise UsageError(
                f"{what} needs the PID of the process: {self.socket} is a remote agent ({REMOTE_HINT})"
            )
        if self.pid is None:
            raise UsageError(f"{what} needs the PID of the process, not a socket path")
        return self.pid

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
        if self.rank is not None and self.rank.relay is not None:  # asked through its node's relay
            from .jobs.relayed import RelayedClient

            return RelayedClient(self.rank.relay, self.rank, timeout, self.log)  # checks each reply's hello
        if self.socket is not None:
            started = time.monotonic()
            try:
                client = Client(self.socket, timeout, self.log)
            except NoAgent as error:
                raise NoAgent(error.message, hint=SOCKET_TARGET_HINT) from None
            return self._checked(client, max(0.001, started + timeout - time.monotonic()))
        pid = self.pid or 0
        try:
            stuck = Stillness(pid).check if give_up_early else None
            return Client(locate_socket(pid, self.log), timeout, self.log, pid=pid, stuck=stuck)
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
        # The look that decides to give up is kept for the answer from outside (fresh_look).
        look, stuck = (self._gil_holder_among, Stillness(pid).check) if give_up_early else (None, None)
        path = attach(pid, "auto", wait, self.log, give_up_early, look, stuck).socket
        return Client(path, timeout, self.log, pid=pid)

    def connect_existing(self, timeout: float) -> Client:
        """A client of the agent already there; never attaches (detach, a repl reconnecting)."""
        path = self.socket or locate_socket(self.pid or 0, self.log)
        return self._checked(Client(path, timeout, self.log, pid=self.pid), timeout)

    def _checked(self, client: Client, timeout: float) -> Client:
        """`client`, once its agent said it is `self.rank` (a remote rank's): its hello, asked
        alone within `timeout`, before any request that could do something in the wrong process."""
        if self.rank is None or not self.remote:
            return client
        try:
            client.call("ping", timeout=timeout)
            mismatch = identity_mismatch(self.rank, self.socket or "", client.info)
        except BaseException:
            client.close()
            raise
        if mismatch is not None:
            client.close()
            raise NotTheRank(mismatch, hint=STALE_ENDPOINT_HINT)
        return client

    def agent_pid(self, timeout: float) -> int:
        """The PID of the process as its agent names it (for a remote target, on its node)."""
        with self.connect(timeout) as client:
            if not client.info:  # a remote rank's connection has its hello already
                client.call("ping")
            pid = client.info.get("pid")
        return pid if isinstance(pid, int) and not isinstance(pid, bool) else 0

    # --- the look from outside, which decides whether to wait on a silent agent ---------------

    def _gil_holder_among(self, among: FrozenSet[int]) -> Optional[str]:
        return self.gil_holder(among=among)

    def gil_holder(self, timeout: float = 0.0, among: Optional[FrozenSet[int]] = None) -> Optional[str]:
        """Which thread holds the GIL, read from outside (py-spy) within `timeout` (at least
        pyspy.OUTSIDE_FLOOR_S); None when none does, when it cannot be read, or when /proc does
        not show the thread py-spy flags keeping it (pyspy.checked_gil: py-spy flags starting
        and exited threads too, and passing holders). The look is kept for the answer that
        follows. `among`: only these thread ids (pyspy.threads_among)."""
        from ..outside.pyspy import dump, gil_holder, threads_among

        if self.pid is None:
            return None
        try:
            threads = dump(self.pid, timeout=timeout)
        except ProbingError as error:
            self.log(f"no look from outside: {error.message}")
            return None
        threads = threads_among(threads, among)
        self._look = (time.monotonic(), threads)
        return gil_holder(threads)

    def fresh_look(self) -> Optional[List[Dict[str, Any]]]:
        """The look taken by `gil_holder` if it is recent enough to answer with (used once)."""
        look, self._look = self._look, None
        if look is None or time.monotonic() - look[0] >= LOOK_FRESH_S:
            return None
        return look[1]
