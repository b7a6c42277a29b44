"""What the agent undoes when it stops (`probing PID detach`, or the job closing its socket),
and what a forked child forgets.

Each feature registers its own stop hook when it first starts something that outlives a
request (a sampler thread, an exit guard, a hook in torch, routed streams), so the server never
needs to know which features exist. Hooks run in the order of their stage, then of registration;
a hook that raises does not keep the others from running.
"""

from __future__ import annotations

from typing import Callable, List, Tuple

from ..originals import allocate_lock

# Stages, in the order they run at stop.
WORK = 10  # what runs on the agent's behalf: eval threads and their interrupts, samplers
SESSIONS = (
    20  # repl sessions: before the streams go back, an interrupted statement's last words stay captured
)
STREAMS = 30  # sys.stdout/sys.stderr routing
JOB_HOOKS = 40  # hooks inside the job's libraries (torch optimizer and module hooks)

Hook = Callable[[], None]

_lock = allocate_lock()
_hooks: List[Tuple[int, int, Hook]] = []
_fork_hooks: List[Hook] = []


def on_stop(hook: Hook, stage: int = WORK) -> None:
    """Run `hook` when the agent stops; registering the same hook again changes nothing."""
    with _lock:
        if any(known is hook or known == hook for _, _, known in _hooks):
            return
        _hooks.append((stage, len(_hooks), hook))


def run_stop_hooks() -> List[str]:
    """Run every registered hook once, in stage order, and forget them; the errors, as text."""
    with _lock:
        hooks = sorted(_hooks, key=lambda entry: (entry[0], entry[1]))
        del _hooks[:]
    errors = []
    for _, _, hook in hooks:
        try:
            hook()
        except Exception as error:  # one feature failing to stop must not keep the rest running
            errors.append(f"{getattr(hook, '__qualname__', hook)}: {type(error).__name__}: {error}")
    return errors


def on_fork_in_child(hook: Hook) -> None:
    """Run `hook` in the child of every later fork (a DataLoader worker): a feature forgets the
    threads that did not survive the fork. Kept for every fork, not run once."""
    with _lock:
        if not any(known is hook or known == hook for known in _fork_hooks):
            _fork_hooks.append(hook)


def run_fork_hooks() -> None:
    """In a forked child, from os.register_at_fork: nothing may raise there (it would print)."""
    global _lock
    # The parent's lock may have been held by a thread that does not exist in the child.
    _lock = allocate_lock()
    for hook in list(_fork_hooks):
        try:
            hook()
        except Exception:  # noqa: BLE001, S110 - a fork handler must never fail the job's fork
            pass
