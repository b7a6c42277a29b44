"""`probing PID listen`: have a running agent listen on TCP (authenticated by the job's token)
and register its endpoint in the job's rendezvous store, so that ranks on other nodes can be
reached (engine/jobs/remote.py)."""

from __future__ import annotations

import os
from typing import Any, Dict, NamedTuple, Optional

from ..errors import BadReply, UsageError
from ..procfs import effective_uid
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


def token_for(target: Target) -> Optional[str]:
    """The CLI's token when the target runs as the CLI's own user; None otherwise.

    Root listening in another user's job must not hand root's token to that job (a job may be
    hostile, and the token opens every agent that trusts it): the job's agent then loads its
    own, from its environment (PROBING_TOKEN) or its user's token file."""
    if target.remote:
        return None  # over TCP the agent only says where it listens: the token never crosses a network
    owner = _owner(target)
    mine = os.geteuid()
    if owner is not None and owner != mine:
        target.log(
            f"the target runs as uid {owner}, not as ours ({mine}): our token is not sent; its agent "
            "uses the job's own (PROBING_TOKEN in its environment, or its user's token file)"
        )
        return None
    token = cli_token()
    target.log("our token goes with the request (the target runs as our user)")
    return token


def _owner(target: Target) -> Optional[int]:
    """The uid the target process runs as (its PID's, else its socket's owner); None if unknown."""
    if target.pid is not None:
        return effective_uid(target.pid)
    try:
        return os.stat(target.socket or "").st_uid
    except OSError:
        return None


def start_listening(target: Target, address: str, timeout: float) -> Listening:
    """Ask the target's agent to listen on `address` ([HOST:]PORT or auto). Over its Unix socket,
    when the process is the CLI's user's, the CLI's token goes with the request (`token_for`);
    otherwise the agent loads the job's own."""
    params: Dict[str, Any] = {"address": address}
    token = token_for(target)
    if token is not None:
        params["token"] = token
    with target.connect(timeout) as client:
        result, _ = client.call("listen", params)
        return _listening(target.pid or client.info.get("pid"), result)
