"""The client side of `probing PID repl`: one console session held by the target's agent.

Never prints. Each request is short (a push or a poll waits at most ~0.3 s in the agent for
the running statement), so the terminal stays responsive to Ctrl-C between replies. The
session lives in the agent, not in the connection: when the agent has closed an idle
connection (after 10 minutes), the next request reconnects and carries on in the same
session, with the same names.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from ..errors import AgentUnreachable

if TYPE_CHECKING:
    from .connection import Client

# Called while a reply is awaited, with the seconds waited so far: False gives up.
KeepWaiting = Callable[[float], bool]

# How often the wait for a reply looks at keep_waiting.
WAIT_SLICE_S = 0.1
# Once a reply starts arriving: how long it may take to come in whole (a screenful of output).
REPLY_TIMEOUT_S = 30.0
# How long tab completion may take before it offers nothing.
COMPLETE_TIMEOUT_S = 2.0


class StoppedWaiting(Exception):
    """The user stopped waiting for a reply; the connection was dropped (it would bring the
    reply later, out of turn) and the next request opens another."""


class RemoteConsole:
    """`push` lines, `poll` the running statement, `interrupt` it; replies are the agent's dicts:
    `more` (a continuation line is expected), `done`, `stdout`, `stderr` (what was printed since
    the last reply), and once done `exception`, `traceback` and `leave` (exit() was called)."""

    def __init__(self, client: Client, reconnect: Callable[[], Client]) -> None:
        self._client: Optional[Client] = client
        self._reconnect = reconnect
        self.session = ""
        self.info: Dict[str, Any] = {}
        # Set when the user stopped waiting for a statement: the next push first makes sure
        # the agent knows to let it go (the connection's close may not have reached it yet).
        self.gave_up = False
        self.open()

    def open(self) -> None:
        """Open a new session (at start, or when the agent has dropped ours)."""
        opened = self._request("open", {})
        self.session = opened["session"]
        self.info = dict(self._client.info if self._client is not None else {}, **opened)

    def push(self, line: str, keep_waiting: Optional[KeepWaiting] = None) -> Dict[str, Any]:
        if self.gave_up:
            self._request("interrupt", {}, keep_waiting)
            self.gave_up = False
        return self._request("push", {"line": line}, keep_waiting)

    def poll(self, keep_waiting: Optional[KeepWaiting] = None) -> Dict[str, Any]:
        return self._request("poll", {}, keep_waiting)

    def interrupt(self, keep_waiting: Optional[KeepWaiting] = None) -> bool:
        """Raise KeyboardInterrupt in the running statement; whether one was running."""
        return bool(self._request("interrupt", {}, keep_waiting).get("interrupted"))

    def reset(self) -> None:
        """Forget the lines of an incomplete statement (Ctrl-C at a continuation prompt)."""
        self._request("reset", {})

    def complete(self, text: str) -> List[str]:
        def keep_waiting(waited: float) -> bool:
            return waited < COMPLETE_TIMEOUT_S

        matches: List[str] = self._request("complete", {"text": text}, keep_waiting)["matches"]
        return matches

    def close(self) -> None:
        """End the session in the agent (best effort: the agent may be gone) and disconnect."""
        client, self._client = self._client, None
        if client is None:
            return
        try:
            if self.session:
                client.send("repl", {"action": "close", "session": self.session})
                client.receive("repl", timeout=2.0)
        except Exception:  # noqa: BLE001, S110 - leaving must work whatever state the agent is in
            pass
        finally:
            client.close()

    def drop_connection(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _connected(self) -> Client:
        if self._client is None:
            self._client = self._reconnect()
        return self._client

    def _request(
        self, action: str, params: Dict[str, Any], keep_waiting: Optional[KeepWaiting] = None
    ) -> Dict[str, Any]:
        request = dict(params, action=action)
        if action != "open":
            request["session"] = self.session
        try:
            return self._exchange(request, keep_waiting)
        except AgentUnreachable:
            # The agent closed the connection: idle for 10 minutes, so nothing of this request
            # ran. A fresh connection tells whether the agent is still there (reconnect raises
            # when it is not), and the request goes again.
            self.drop_connection()
            return self._exchange(request, keep_waiting)

    def _exchange(self, request: Dict[str, Any], keep_waiting: Optional[KeepWaiting]) -> Dict[str, Any]:
        client = self._connected()
        client.send("repl", request)
        started = time.monotonic()
        while not client.answered(WAIT_SLICE_S):
            if keep_waiting is not None and not keep_waiting(time.monotonic() - started):
                self.drop_connection()
                self.gave_up = request["action"] in ("push", "poll", "interrupt")
                raise StoppedWaiting()
        result, _ = client.receive("repl", timeout=REPLY_TIMEOUT_S)
        reply: Dict[str, Any] = result
        return reply
