"""Starting the TCP listener: at most one per process, never without a token, and what to say
when it cannot start (agent/__init__.py for PROBING_LISTEN, handlers.py for `listen`).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

from ...originals import allocate_lock
from ...protocol.auth import TOKEN_ENV, TOKEN_HINT, TokenError, load_token
from .acceptor import BACKLOG, Admitting, TcpListener
from .address import AddressError, bind_tcp, parse_listen_address


class ListenError(Exception):
    """The listener cannot start; the message says why and what to do."""


def start_listener(server: Admitting, address: str, token: Optional[str] = None) -> TcpListener:
    """Bind `address` ([HOST:]PORT or auto) and serve it; ListenError says why not.

    `token`: the one a `listen` request brought (the CLI's own, over the peer-checked Unix
    socket); else the agent loads its own (PROBING_TOKEN, the token file).
    """
    try:
        secret = load_token({TOKEN_ENV: token}) if token is not None else load_token()
    except TokenError as error:
        raise ListenError(f"refusing to listen on TCP without a token: {error}; {TOKEN_HINT}") from None
    try:
        host, port = parse_listen_address(address)
    except AddressError as error:
        raise ListenError(str(error)) from None
    try:
        sock = bind_tcp(host, port, BACKLOG)
    except (OSError, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ListenError(f"cannot listen on {host}:{port}: {reason}") from None
    try:
        listener = TcpListener(server, sock, secret)
        listener.start()
    except Exception as error:  # noqa: BLE001 - can't start new thread, and the like
        sock.close()
        raise ListenError(f"cannot start the TCP listener: {type(error).__name__}: {error}") from None
    return listener


# Two `listen` requests at once must not start two listeners (the loser's would be orphaned).
_start_lock = allocate_lock()


def listen_once(server: Any, address: str, token: Optional[str] = None) -> Tuple[TcpListener, bool]:
    """(the server's listener, whether it was already running): started on `address` unless one
    serves. `server` is the agent's AgentServer; its tcp_listener and listen_error are set here."""
    with _start_lock:
        listener = server.tcp_listener
        if isinstance(listener, TcpListener) and listener.running():
            return listener, True
        listener = start_listener(server, address, token)
        server.tcp_listener = listener
        server.listen_error = None
        return listener, False


def _new_lock_in_child() -> None:
    # A thread of the parent may have held it at fork; the child has no such thread.
    global _start_lock
    _start_lock = allocate_lock()


os.register_at_fork(after_in_child=_new_lock_in_child)
