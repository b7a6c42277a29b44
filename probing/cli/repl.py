"""`probing PID repl`: the terminal side of a console running inside the target.

Line editing, history and tab completion come from readline (when stdin is a terminal);
statements run in the target (agent/repl.py) and their output streams back through
console.RemoteConsole. Ctrl-C while a statement runs interrupts it in the target; a second
Ctrl-C stops waiting for one blocked outside Python. Ctrl-D leaves. With stdin not a terminal
the lines are read as a script would be: no prompts, no banner.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import click

from ..client.connection import Client
from ..client.console import RemoteConsole, StoppedWaiting
from ..engine.target import Target
from ..errors import AgentUnreachable, ExitCode, NoAgent, ProcessNotFound, SessionGone
from ..procfs import process_alive
from .invocation import Invocation
from .options import apply, pass_invocation
from .render.repl import (
    after_ctrl_c,
    end_of_input,
    read_line,
    repl_note,
    write_repl_banner,
    write_repl_keyboard_interrupt,
    write_repl_reply,
)
from .spec import timeout as timeout_option

HISTORY_LENGTH = 1000
# A reply normally comes within ~0.35 s; after this long the agent is not answering (a thread
# holds the GIL), and a second Ctrl-C stops waiting for it.
QUIET_AGENT_S = 1.0
# When the agent has not answered for this long, say why it may be (and how to stop waiting).
SLOW_REPLY_S = 10.0
# A script stopped by Ctrl-C exits as a shell reports it: 128 + SIGINT.
STOPPED_BY_CTRL_C = 130
# After the agent vanished: how long to wait for its process to be gone too (it is exiting). A
# process killed under CI's load was still not a zombie 1 s after SIGKILL (its threads wait for a
# core to run their exit), and the repl said "agent closed the connection" rather than "exited".
EXIT_GRACE_S = 3.0


def history_path() -> str:
    return os.environ.get("PROBING_HISTORY") or os.path.expanduser("~/.probing_history")


class Interrupts:
    """Counts Ctrl-C while the agent is asked something. SIGINT sets a count instead of raising
    KeyboardInterrupt, which could cut a reply in half and leave the connection unreadable."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: Any = None

    def __enter__(self) -> Interrupts:
        self.count = 0
        self._previous = signal.signal(signal.SIGINT, self._count)
        return self

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _count(self, signum: int, frame: Any) -> None:
        self.count += 1


class LineEditing:
    """readline with the history file; reading or writing it may fail without consequence."""

    def __init__(self, console: RemoteConsole) -> None:
        self.readline: Any = None
        try:
            import readline
        except ImportError:
            return
        self.readline = readline
        self.path = history_path()
        self.console = console
        self._matches: List[str] = []
        try:
            readline.read_history_file(self.path)
        except Exception:  # noqa: BLE001, S110 - no history yet, or unreadable: start without
            pass
        readline.set_history_length(HISTORY_LENGTH)
        readline.set_completer(self._complete)
        if "libedit" in (readline.__doc__ or ""):
            readline.parse_and_bind("bind ^I rl_complete")
        else:
            readline.parse_and_bind("tab: complete")

    def _complete(self, text: str, state: int) -> Optional[str]:
        if state == 0:
            self._matches = []
            with Interrupts():
                try:
                    self._matches = self.console.complete(text)
                except Exception:  # noqa: BLE001 - no completion is better than a broken prompt
                    pass
        return self._matches[state] if state < len(self._matches) else None

    def save(self) -> None:
        if self.readline is None:
            return
        try:
            self.readline.write_history_file(self.path)
        except Exception:  # noqa: BLE001, S110 - a read-only home must not spoil leaving
            pass


def reconnect_to(target: Target, timeout: float) -> Callable[[], Client]:
    """How the console gets a new connection to the same agent; never attaches again (after a
    detach the session is gone anyway), and says plainly when the process or agent is gone."""

    def reconnect() -> Client:
        try:
            return target.connect_existing(timeout)
        except (ProcessNotFound, NoAgent, AgentUnreachable) as error:
            if target.pid is None:
                raise
            pid = target.pid
            # A process killed a moment ago may still be there, unreaped, its socket refusing.
            if _exits(pid):
                raise ProcessNotFound(f"PID {pid} exited; the repl session ended with it") from None
            if isinstance(error, AgentUnreachable):
                raise
            raise NoAgent(
                f"the agent in PID {pid} was stopped (detach); the repl session ended with it",
                hint=f"`probing {pid} repl` attaches again, in a new session",
            ) from None

    return reconnect


def _exits(pid: int) -> bool:
    deadline = time.monotonic() + EXIT_GRACE_S
    while process_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run_statement(console: RemoteConsole, line: str) -> Dict[str, Any]:
    """Push one line; when it completes a statement, wait for it, showing its output as it
    comes; Ctrl-C interrupts it in the target. Returns the last reply."""
    with Interrupts() as interrupts:
        noted_slow = False

        def keep_waiting(waited: float) -> bool:
            nonlocal noted_slow
            if interrupts.count >= 2 and waited > QUIET_AGENT_S:
                return False
            if waited > SLOW_REPLY_S and not noted_slow:
                noted_slow = True
                repl_note(
                    f"the agent has not answered for {SLOW_REPLY_S:g} s: a thread may hold the GIL "
                    "(a long C call); Ctrl-C twice stops waiting"
                )
            return True

        try:
            reply = console.push(line, keep_waiting)
            interrupted_at = None
            polls = 0
            while True:
                write_repl_reply(reply)
                if reply.get("done") or reply.get("more"):
                    return dict(reply, ctrl_c=interrupts.count > 0)
                if interrupts.count and interrupted_at is None:
                    console.interrupt(keep_waiting)
                    interrupted_at = polls
                elif interrupts.count >= 2 and interrupted_at is not None and polls > interrupted_at:
                    # The interrupt was sent and a reply came back since: the statement is not
                    # running Python code, where the interrupt would have landed at once.
                    console.gave_up = True
                    break
                reply = console.poll(keep_waiting)
                polls += 1
            why = "still running in the target, blocked outside Python"
        except StoppedWaiting:
            why = "the agent did not answer (a thread holds the GIL?); the statement may still be running"
    after_ctrl_c()
    repl_note(f"{why}; it will be interrupted when it returns to Python")
    return {"more": False, "done": True, "ctrl_c": True}


def _forgiving(console: RemoteConsole, request: Callable[[], Any], retry: bool) -> Any:
    """Run a request; when the agent has dropped the session, say so, open a new one and (for
    a line that starts a statement) run the request again there."""
    try:
        return request()
    except SessionGone:
        repl_note(
            "the agent dropped this repl session (unused for an hour, 16 newer ones opened, or "
            "the agent restarted); a new session starts: names assigned before are gone"
        )
        console.open()
        return request() if retry else {}


@click.command()
@apply(
    timeout_option(
        10.0, "Seconds to wait for the agent to connect (statements may run as long as they like)."
    )
)
@pass_invocation
def repl(invocation: Invocation, timeout: float) -> int:
    """Interactive Python console inside the process, as `python -i` would give.

    Names of the job's __main__ are visible (read live); names you assign stay in the session
    and never change the job's. Ctrl-C interrupts the running statement, Ctrl-D leaves; line
    editing and history (~/.probing_history, or $PROBING_HISTORY) when stdin is a terminal.
    Lines piped in run as a script would: exit 8 if any statement raised.
    """
    return run_repl(invocation.kind().process(), timeout)


def run_repl(target: Target, timeout: float) -> int:
    interactive = sys.stdin.isatty()
    console = RemoteConsole(target.connect(timeout), reconnect_to(target, timeout))
    editing = LineEditing(console) if interactive else None
    if interactive:
        write_repl_banner(console.info)
    failed = False
    more = False
    try:
        while True:
            try:
                line = read_line(interactive, more)
            except EOFError:
                if interactive:
                    end_of_input()
                elif more:  # a script's last block ends at the end of the file
                    failed |= bool(run_statement(console, "").get("exception"))
                break
            except KeyboardInterrupt:
                write_repl_keyboard_interrupt()
                if not interactive:
                    return STOPPED_BY_CTRL_C
                if more:
                    _forgiving(console, console.reset, False)
                    more = False
                continue
            if not more and not line.strip():
                continue
            reply = _forgiving(console, functools.partial(run_statement, console, line), not more) or {}
            more = bool(reply.get("more"))
            failed |= bool(reply.get("exception"))
            if reply.get("leave"):
                break
            if reply.get("ctrl_c") and not interactive:
                return STOPPED_BY_CTRL_C  # a script stops at Ctrl-C, as Python's would
    finally:
        if editing is not None:
            editing.save()
        console.close()
    return ExitCode.REMOTE_ERROR if failed and not interactive else ExitCode.OK
