"""`probing PID listen`: have a running agent listen on TCP (authenticated by the job's token)
and register its endpoint in the job's rendezvous store, so that ranks on other nodes can be
reached (engine/job_remote.py)."""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

from ..errors import BadReply, UsageError
from ..protocol import auth
from .target import Target


class Listening(NamedTuple):
    """What an agent answered to `listen`: where it listens, and whether it is registered."""

    pid: Optional[int]
    endpoint: str
    already: bool  # it listened before this request
    registered: bool  # its endpoint is in the job's store (other nodes can find it)
    registry_error: Optional[str]  # why it is not registered (yet), when the agent knows


def cli_token() -> str:
    """The CLI's token, sent to an agent over its Unix socket (whose peer is checked); a
    missing one is a usage error that says how to make one."""
    try:
        return auth.load_token()
    except auth.TokenError as error:
        raise UsageError(f"listening on TCP needs a token: {error}", hint=auth.TOKEN_HINT) from None


def _listening(pid: Any, result: Dict[str, Any]) -> Listening:
    endpoint = result.get("endpoint")
    if not isinstance(endpoint, str) or not 0 < len(endpoint) <= 256:
        raise BadReply("the agent's answer to 'listen' names no endpoint")
    error = result.get("registry_error")
    return Listening(
        pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        endpoint,
        result.get("already") is True,
        result.get("registered") is True,
        error[:1000] if isinstance(error, str) else None,
    )


def start_listening(target: Target, address: str, timeout: float) -> Listening:
    """Ask the target's agent to listen on `address` ([HOST:]PORT or auto). Over its Unix socket
    the CLI's token goes with the request; over TCP (already authenticated) the agent only says
    where it listens: the token never crosses a network."""
    params: Dict[str, Any] = {"address": address}
    if not target.remote:
        params["token"] = cli_token()
    with target.connect(timeout) as client:
        result, _ = client.call("listen", params)
        return _listening(target.pid or client.info.get("pid"), result)
