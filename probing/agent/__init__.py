"""The agent: runs inside the target process and answers the CLI over a Unix socket.

Standard library only, Python 3.8 syntax, nothing heavy imported at start: `start()` binds the
socket and starts one daemon thread blocked in accept(); request handling code is imported on
the first connection. See DESIGN.md, "Agent rules".
"""

from __future__ import annotations

import os
from typing import Optional, Set, Tuple

from ..originals import allocate_lock, get_ident, get_native_id
from ..procfs import thread_names
from .lifecycle import run_fork_hooks
from .listener.address import listen_setting
from .server import AgentServer
from .sockets import AGENT_THREAD_NAME, descriptor_identity, release

_lock = allocate_lock()
_server: Optional[AgentServer] = None
last_error: Optional[str] = None


# (st_dev, st_ino) of the socket's file, taken when the agent started: how start() tells its
# own socket file from one the job removed or replaced (the descriptor's is the server's own).
_path_identity: Optional[Tuple[int, int]] = None
# OS thread ids of the accept threads this copy started (alive or not).
_accept_threads: Set[int] = set()


def _another_copy_serves(own: Optional[AgentServer]) -> bool:
    """Whether a second copy of this package (loaded by file path, or from another install)
    already serves this process: one agent per process, whoever started it.

    Agent threads are invisible to `threading` (threads.py): the OS names the accept thread of
    every copy. Ours do not count: a dead server's accept thread may still be blocked on its
    closed socket, and the attach helper's thread calling us is named like one."""
    mine = {get_native_id()} | _accept_threads
    return any(name == AGENT_THREAD_NAME and tid not in mine for tid, name in thread_names("self").items())


def _identity(info: os.stat_result) -> Tuple[int, int]:
    return info.st_dev, info.st_ino


def _listening(server: AgentServer) -> bool:
    """Whether the server still listens where clients look: its accept thread runs, its
    descriptor is still its socket, and its file is still in the directory.

    A job may close the descriptor under us (os.closerange(3, ...) before daemonizing, or an
    eval), and then open something else that gets the same number; or delete the socket file.
    The accept thread can outlive any of these (blocked in accept() on a socket nobody can
    reach), so its being alive proves nothing.
    """
    if not server.serving():
        return False
    try:
        path = os.stat(server.path)
    except OSError:
        return False
    ours = descriptor_identity(server.listener) == server.listener_identity
    return ours and _identity(path) == _path_identity


def _abandon(server: AgentServer) -> None:
    """Let a dead server go without touching the job's descriptors.

    stop() would shut down and close the listener's descriptor number, which the job may have
    reused since it closed ours; and it would undo the stream routing and hooks that the new
    server inherits. So: stop its threads at their next wake-up, and close its listener only
    if the descriptor is still our socket; otherwise forget the number (detach), so that the
    socket object's finalizer never closes the job's file.
    """
    server._stopping = True
    release(server.listener, server.listener_identity)
    # Its store client (an `endpoints` request made one) may have lost its descriptor too: it is
    # kept, never destroyed (the new server inherits it only with a running listener).
    if server.registry is not None:
        server.registry.abandon()


def _take_over(previous: AgentServer, server: AgentServer) -> None:
    """The new server in place of one that stopped listening (start(), under its lock)."""
    _abandon(previous)
    # One set for both: the sampler and any worker the old server started are still
    # the agent's own threads, never the job's, in backtraces.
    server.own_threads = previous.own_threads
    # A TCP listener outlives the Unix socket it was started beside: it hands its
    # clients to the new server from now on.
    listener = previous.tcp_listener
    if listener is not None and listener.running():
        listener.server = server
        server.tcp_listener = listener


def _start_sampling(server: AgentServer) -> Optional[str]:
    """Start the memory sampler; why it could not, or None."""
    try:
        from .memory.sampler import start_sampling  # it forgets itself in a forked child

        start_sampling(server.own_threads)
    except Exception as error:  # noqa: BLE001 - sampling is optional, the agent is not
        return f"memory sampling: {type(error).__name__}: {error}"
    return None


def _undo_start(server: AgentServer, previous: Optional[AgentServer]) -> None:
    """What start() began for a server that could not start: the sampler, and a TCP listener
    started for it (not one taken over from `previous`)."""
    from .memory.sampler import stop_sampling

    stop_sampling()
    if server.tcp_listener is not None and server.tcp_listener is not getattr(previous, "tcp_listener", None):
        server.tcp_listener.stop()


def start(socket_dir: Optional[str] = None, calling_thread_is_ours: bool = False) -> bool:
    """Start serving on `<socket dir>/<pid>.sock`; a no-op when an agent already serves.

    An agent whose socket the job closed or removed is replaced by a new one (an attach
    after `probing PID backtrace` said "stopped listening"). Returns False (and sets
    `last_error`) when the agent cannot start; never raises and never prints, because it
    runs inside someone else's program.

    `calling_thread_is_ours`: the caller is the attach helper's thread, which lives on for a
    moment after the socket serves (a backtrace may catch it waiting for the accept thread to
    start); it is left out of backtraces until it calls `release_calling_thread()`.
    """
    global _server, last_error, _path_identity
    with _lock:
        previous = _server
        if previous is not None and _listening(previous):
            return True
        if _another_copy_serves(previous):
            return True
        try:
            server = AgentServer.bind(socket_dir)
            path_identity = _identity(os.stat(server.path))
        except Exception as error:  # noqa: BLE001 - reported through last_error, never raised
            last_error = f"{type(error).__name__}: {error}"
            return False
        if previous is not None:
            _take_over(previous, server)
        server.on_detach = stop
        if calling_thread_is_ours:
            server.own_threads.add(get_ident())
        # The sampler starts before the socket serves: a backtrace must never catch its thread
        # before it is known as the agent's own.
        sampling_error = _start_sampling(server)
        # The TCP listener before the socket serves: the first hello already says how it went.
        _listen_from_environment(server)
        try:
            server.start()
        except Exception as error:  # noqa: BLE001 - can't start new thread, say
            last_error = f"{type(error).__name__}: {error}"
            _undo_start(server, previous)
            return False
        _server = server
        _path_identity = path_identity
        if server.accept_thread_id is not None:
            _accept_threads.add(server.accept_thread_id)
        last_error = sampling_error
    try:
        # Hooks only (excepthook, signals, faulthandler): a job that never ends pays nothing.
        from .records import install as install_records

        install_records(server)
    except Exception as error:  # noqa: BLE001 - records are optional, the agent is not
        last_error = f"records: {type(error).__name__}: {error}"
    problem = _arm_torch_from_environment()
    if problem is not None:
        last_error = problem
    return True


def _arm_torch_from_environment() -> Optional[str]:
    """PROBING_TORCH_TRACE and PROBING_NAN: tracing and NaN checks from the job's start (armed
    for when it imports torch). Why one could not be armed, or None; never raises."""
    problem = None
    for variable, starter in (("PROBING_TORCH_TRACE", "start_trace"), ("PROBING_NAN", "start_nan")):
        value = os.environ.get(variable, "").strip()
        if not value or value.lower() in ("0", "off", "false", "no"):
            continue
        try:
            from .pytorch import environment

            getattr(environment, starter)(value)
        except Exception as error:  # noqa: BLE001 - torch features are optional, the agent is not
            problem = f"{variable}: {type(error).__name__}: {error}"
    return problem


def _listen_from_environment(server: AgentServer) -> None:
    """PROBING_LISTEN: serve TCP too. Never fails the agent: why it could not (no token, the
    port taken) is kept for `hello` to say, since the agent never prints into the job."""
    address = listen_setting()
    if address is None or server.tcp_listener is not None:
        return
    # Loaded only when asked: most jobs never listen, and every job pays for what starts here.
    from .listener.launcher import LAUNCHER_REFUSAL, launcher_program

    if launcher_program() is not None:
        # torchrun's own process: PROBING_LISTEN is for its ranks (a `listen` request still
        # works, since whoever sends one asks for this very process).
        server.listen_error = LAUNCHER_REFUSAL
        return
    from .listener.control import ListenError, listen_once

    try:
        listen_once(server, address)
    except ListenError as error:
        server.listen_error = f"PROBING_LISTEN={address}: {error}"
    except Exception as error:  # noqa: BLE001 - the Unix socket serves whatever happens here
        server.listen_error = f"PROBING_LISTEN={address}: {type(error).__name__}: {error}"


def release_calling_thread() -> None:
    """The attach helper's thread is about to end: forget its ident, which a thread of the job
    may get next (idents are reused)."""
    server = _server
    if server is not None:
        server.own_threads.discard(get_ident())
        # It still unwinds the import that ran it: a backtrace served meanwhile must not show it.
        from .stacks import leave

        leave()


def stop() -> None:
    """Stop serving: close the socket, remove its file, undo what requests installed."""
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None:
        server.stop()


def running() -> bool:
    server = _server
    return server is not None and _listening(server)


def socket_path() -> Optional[str]:
    server = _server
    return server.path if server is not None else None


def _forget_after_fork() -> None:
    # In a forked child (a DataLoader worker) the accept thread does not exist and the
    # listening socket is the parent's: drop both without touching the parent's socket file.
    global _server, _lock
    _lock = allocate_lock()
    server, _server = _server, None
    _accept_threads.clear()  # the child's threads are its own
    if server is not None:
        server.abandon_in_child()
    run_fork_hooks()


os.register_at_fork(after_in_child=_forget_after_fork)
