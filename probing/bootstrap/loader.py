"""Loads the agent from this install into a process that may not have probing installed.

Executed by file path (never imported through sys.path) by sitecustomize.py (`probing run`)
and attach.py (a process probing attached to). It imports the `probing` package from the
directory above this one by file path, so neither the CLI's site-packages nor anything else
is added to the process's sys.path, and no third-party module is imported.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def import_threading_as_the_job_would() -> None:
    """Import `threading` so that it describes the job's real main thread, from any thread.

    `threading` takes the thread that first imports it for the main thread: on CPython before
    3.13, `_MainThread()` records `get_ident()` of the importing thread and makes its lock a
    sentinel of that thread's state. Imported first by probing's attach thread (on Pythons
    that do not import threading at start-up: 3.8-3.10, 3.12, Debian's 3.11), the job's
    real main thread became a `_DummyThread`, `main_thread() is current_thread()` was False
    there, and at exit `_shutdown` tripped over the attach thread's released lock and never
    joined the job's non-daemon threads. So the object the import made is pointed at the
    real main thread, and this thread is left out of `threading._active`, as any thread
    threading did not start is until it asks for current_thread().
    """
    if "threading" in sys.modules:
        return  # the job's own threading, right or wrong: not ours to change
    import _thread

    if hasattr(_thread, "_get_main_thread_ident"):
        # 3.13+: _MainThread() asks the runtime for the main thread's ident and handle; only
        # its native id is read from the importing thread.
        import threading  # noqa: F401 - the import is the point

        main = _private(sys.modules["threading"])._main_thread
        if main.ident != _thread.get_ident() and hasattr(main, "_native_id"):
            main._native_id = os.getpid()
        return
    main_ident = _main_thread_ident()
    import threading

    job_threading = _private(threading)
    made = job_threading._main_thread
    mine = _thread.get_ident()
    if main_ident is None or main_ident == mine or made.ident != mine:
        return  # we are the main thread (pyrasite runs here), or cannot tell which it is
    # The sentinel `_set_tstate_lock` made is released when *this* thread's state is deleted
    # (the helper's PyGILState_Release): `_shutdown` asserts the main thread's is still held,
    # and a job joining main_thread() would return early. The main thread's lock is released
    # by `_shutdown` itself, so a plain held lock is exactly what it needs.
    sentinel = made._tstate_lock
    held = _thread.allocate_lock()
    held.acquire()
    with job_threading._active_limbo_lock:
        made._ident = main_ident
        if hasattr(made, "_native_id"):
            # The main thread of a `python` process is the thread group leader: TID == PID.
            made._native_id = os.getpid()
        made._tstate_lock = held
        job_threading._active.pop(mine, None)
        job_threading._active[main_ident] = made
    shutdown_locks = getattr(threading, "_shutdown_locks", None)
    if shutdown_locks is not None:
        with job_threading._shutdown_locks_lock:
            shutdown_locks.discard(sentinel)
            shutdown_locks.add(held)


def _main_thread_ident() -> "int | None":
    """The ident of the thread that started the interpreter, without asking `threading`.

    CPython keeps each interpreter's thread states newest first (a new one is put at the
    head of the list), the main interpreter last, and `sys._current_frames()` walks that
    list under the runtime's lock: its last entry is the oldest thread with a Python frame,
    the main thread running the job's script. (3.8-3.12 expose nothing more direct; the
    runtime's own `main_thread` field is reachable from Python only from 3.13 on.)
    """
    # gc paused around the read, from C (no bytecode in between), as agent/stacks.py's
    # current_frames does: up to 3.11 a collection inside it can freeze the process (gh-106883).
    import gc
    import operator

    if gc.isenabled():
        _, frames, _ = map(operator.methodcaller("__call__"), (gc.disable, sys._current_frames, gc.enable))
    else:
        frames = sys._current_frames()
    try:
        return int(list(frames)[-1])
    except IndexError:
        return None
    finally:
        del frames


def _private(module: object) -> "Any":
    """A module whose private names (threading._active...) we use: typeshed lists none."""
    return module


def forget_this_thread() -> None:
    """The helper's thread is about to end: the agent forgets it, and the `_DummyThread` that
    a current_thread() call in it may have left goes (before 3.13 it would stay in the job's
    threading.enumerate() for good)."""
    agent = sys.modules.get("probing.agent")
    if agent is not None:
        agent.release_calling_thread()
    if "threading" not in sys.modules:
        return
    threading = _private(sys.modules["threading"])
    with threading._active_limbo_lock:
        entry = threading._active.get(threading.get_ident())
        if isinstance(entry, threading._DummyThread):
            del threading._active[threading.get_ident()]


def start_agent(package_dir: str, preload: "tuple[str, ...]" = (), helper: bool = False) -> "str | None":
    """Start the agent; returns None, or why it could not start. Never raises, never prints.

    `preload`: modules to import before the socket listens, so that a client that connects
    as soon as it can finds them loaded. `helper`: called from the attach helper's thread,
    which backtraces leave out until forget_this_thread().
    """
    try:
        import_threading_as_the_job_would()
        if "probing" not in sys.modules:
            # The import system's own frozen modules, always loaded: importlib.util would first
            # import a dozen modules from disk, and in an attach each file read hands the GIL to
            # the job's threads (see attach.py).
            machinery = _private(sys.modules["_frozen_importlib_external"])
            bootstrap = _private(sys.modules["_frozen_importlib"])
            spec = machinery.spec_from_file_location(
                "probing",
                os.path.join(package_dir, "__init__.py"),
                submodule_search_locations=[package_dir],
            )
            if spec is None or spec.loader is None:
                return "cannot load the probing package from " + package_dir
            package = bootstrap.module_from_spec(spec)
            sys.modules["probing"] = package
            spec.loader.exec_module(package)
        import probing.agent as agent

        for module in preload:
            __import__(module)
        if agent.start(calling_thread_is_ours=helper):
            return None
        return agent.last_error or "the agent did not start"
    except Exception as error:  # noqa: BLE001 - the job must never see our failure
        return f"{type(error).__name__}: {error}"
