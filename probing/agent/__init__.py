"""The agent: runs inside the target process and answers the CLI over a Unix socket.

Standard library only, Python 3.8 syntax, nothing heavy imported at start: `start()` binds the
socket and starts one daemon thread blocked in accept(); request handling code is imported on
the first connection. See DESIGN.md, "Agent rules".
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Optional

from .server import AGENT_THREAD_NAME, AgentServer

_lock = threading.Lock()
_server: Optional[AgentServer] = None
last_error: Optional[str] = None


def _another_copy_serves() -> bool:
    # A second copy of this package (loaded by file path, or from another install) may
    # already serve this process: one agent per process, whoever started it.
    return any(thread.name == AGENT_THREAD_NAME and thread.is_alive() for thread in threading.enumerate())


def start(socket_dir: Optional[str] = None) -> bool:
    """Start serving on `<socket dir>/<pid>.sock`; a no-op when an agent already serves.

    Returns False (and sets `last_error`) when the agent cannot start; never raises and
    never prints, because it runs inside someone else's program.
    """
    global _server, last_error
    with _lock:
        if _server is not None and _server.serving():
            return True
        if _another_copy_serves():
            return True
        try:
            server = AgentServer.bind(socket_dir)
        except Exception as error:  # noqa: BLE001 - reported through last_error, never raised
            last_error = f"{type(error).__name__}: {error}"
            return False
        # The sampler starts before the socket serves: a backtrace must never catch its thread
        # before it is known as the agent's own.
        sampling_error = None
        try:
            from .memory import start_sampling

            start_sampling(server.own_threads)
        except Exception as error:  # noqa: BLE001 - sampling is optional, the agent is not
            sampling_error = f"memory sampling: {type(error).__name__}: {error}"
        try:
            server.start()
        except Exception as error:  # noqa: BLE001 - can't start new thread, say
            last_error = f"{type(error).__name__}: {error}"
            from .memory import stop_sampling

            stop_sampling()
            return False
        _server = server
        last_error = sampling_error
    torch_trace = os.environ.get("PROBING_TORCH_TRACE", "").strip()
    if torch_trace and torch_trace.lower() not in ("0", "off", "false", "no"):
        try:
            from .torchtrace import start_from_environment

            start_from_environment(torch_trace)
        except Exception as error:  # noqa: BLE001 - tracing is optional, the agent is not
            last_error = f"PROBING_TORCH_TRACE: {type(error).__name__}: {error}"
    return True


def stop() -> None:
    """Stop serving: close the socket, remove its file, undo what requests installed."""
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None:
        server.stop()


def running() -> bool:
    server = _server
    return server is not None and server.serving()


def socket_path() -> Optional[str]:
    server = _server
    return server.path if server is not None else None


def _forget_after_fork() -> None:
    # In a forked child (a DataLoader worker) the accept thread does not exist and the
    # listening socket is the parent's: drop both without touching the parent's socket file.
    global _server, _lock
    _lock = threading.Lock()
    server, _server = _server, None
    if server is not None:
        server.abandon_in_child()
    memory = sys.modules.get(__package__ + ".memory")
    if memory is not None:
        memory.forget_after_fork()


os.register_at_fork(after_in_child=_forget_after_fork)
