"""Getting an agent into a process that has none. Never prints; narrates through `log`.

    attach(pid, method="auto", timeout=5.0, log=...) -> Attached

Methods (attach/methods.py) share one interface: they make the process load the helper
library and call probing_helper_start(); the helper's own thread then waits for the GIL and
starts the agent (bootstrap/attach.py). Attaching is idempotent: a process whose agent
answers is left alone. The seam for CPython 3.14's `sys.remote_exec(pid, script)` is one
more method running bootstrap/attach.py, for a CLI itself running on 3.14.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, FrozenSet, List, NamedTuple, Optional, Set, Tuple

from ..client.discovery import agent_listens, python_version_of, require_process, socket_candidates
from ..errors import AttachFailed, AttachTimeout, NotPython, ProbingError, ProcessNotFound
from ..outside.pyspy import dump, gil_holder, threads_among
from ..procfs import executable, process_alive, thread_ids, thread_names, thread_work_done
from .containers import helper_paths
from .diagnose import why_no_agent
from .methods import InjectReport, choose_method

Log = Callable[[str], None]

# Sockets are looked for this often while the agent starts.
_POLL_S = 0.005


class Attached(NamedTuple):
    socket: str
    report: Optional[InjectReport]  # None when this call injected nothing (an agent was there or on its way)
    waited_ms: float  # from the end of the injection until the agent answered


def _quiet(message: str) -> None:
    pass


def check_target(pid: int) -> str:
    """The target's Python version, or the error that says why it cannot be attached to."""
    require_process(pid)
    version = python_version_of(pid)
    exe = os.path.basename(executable(pid) or "")
    if "pypy" in exe.lower():
        raise NotPython(f"PID {pid} runs PyPy ({exe}): probing attaches to CPython 3.8 and later only")
    if version is None:
        raise NotPython(f"PID {pid} is not a Python process")
    parts = version.split(".")
    if len(parts) == 2 and (int(parts[0]), int(parts[1])) < (3, 8):
        raise NotPython(
            f"PID {pid} runs Python {version}: probing attaches to CPython 3.8 and later only",
            hint="py-spy dump --pid PID still reads its stacks from outside",
        )
    return version


def _answering_socket(pid: int) -> Optional[str]:
    for path in socket_candidates(pid):
        if os.path.exists(path) and agent_listens(path):
            return path
    return None


# native/helper.c names its thread "probing-attach" while it waits for the GIL, and
# "probing-agent" once it holds it and loads the agent. The threads the agent starts name
# themselves "probing-..." too (agent/threads.py).
WAITING_NAME = "probing-attach"
LOADING_NAME = "probing-agent"
_AGENT_PREFIX = "probing-"
# The native front end attaches in the common case (native/front/attach.c) and hands a wait
# that takes long to this CLI with PROBING_INJECTED=PID: the helper is in, never inject again.
INJECTED_ENV = "PROBING_INJECTED"
# Why an attach that found the GIL held answers from outside (after who holds it).
HELD = "the agent will start when it is released"


def _injected_by_the_front_end(pid: int) -> bool:
    """The native front end handed this attach over with the helper in `pid` (INJECTED_ENV),
    and the helper's thread is there (waiting for the GIL, or loading the agent): a variable
    left in the environment by anyone else, or a helper that has gone, is no reason not to
    inject."""
    if os.environ.pop(INJECTED_ENV, None) != str(pid):
        return False
    return bool({WAITING_NAME, LOADING_NAME} & set(thread_names(pid).values()))


def _bootstrap_waiting(pid: int) -> bool:
    """An earlier attach's helper thread still waits for the GIL."""
    return WAITING_NAME in thread_names(pid).values()


class _Loading:
    """Whether the helper's thread, having got the GIL, still makes headway loading the agent.

    The loader reads a few dozen files; each read hands the GIL to the job's threads. When one
    of them holds it for long stretches without a break (a gc.collect() loop over a big heap:
    ~100 ms each), every read costs a whole stretch and loading can take seconds, although
    the job lets the GIL go all the time. That is no reason to give up: --attach-timeout bounds
    the wait for a GIL that never comes free; a loader that is moving is waited for longer.

    Once the agent's modules are imported (every attach after a detach), the loader reads no
    file and waits, using no CPU, while each thread it starts (the memory sampler, the accept
    thread) gets the GIL for its first lines, a whole stretch each: such a load was given up
    after 5 s with no tick of the loader's own (CI, with the machine loaded). The threads it
    started are its headway too: any new thread named probing-... that appears or works counts.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        # A helper that got the GIL at once is never seen waiting: any thread that did not
        # exist before the injection and carries either name is ours.
        self.before = {tid for tid, name in thread_names(pid).items() if name != WAITING_NAME}
        self.helpers: Set[int] = set()
        self.last: Dict[int, Tuple[int, ...]] = {}
        self.moved_at = 0.0
        self.looked_at = 0.0

    def look(self) -> None:
        now = time.monotonic()
        if now - self.looked_at < _LOOK_EVERY_S:
            return  # /proc/PID/task/* of a job with hundreds of threads is not read every 5 ms
        self.looked_at = now
        for tid, name in thread_names(self.pid).items():
            if name == WAITING_NAME:
                self.helpers.add(tid)
            elif name.startswith(_AGENT_PREFIX) and (tid in self.helpers or tid not in self.before):
                work = thread_work_done(self.pid, tid)
                if work is not None and work != self.last.get(tid):
                    self.last[tid] = work
                    self.moved_at = now

    def moving(self) -> bool:
        return bool(self.last) and time.monotonic() - self.moved_at < _STALLED_S


# A loader that shows no work for this long is stuck, not slow. A collection of a big heap
# holds the GIL for 100-300 ms; on a loaded machine the thread holding it may also be off the
# CPU for a while: 1 s stalled healthy loads twice in 20 during the test suite, and 5 s one
# re-attach in 10 in CI (its CPU ticks are sampled: a thread that gets the GIL for a moment per
# collection may show none for seconds). A loader truly stuck costs this long before exit 10.
_STALLED_S = 10.0
_LOOK_EVERY_S = 0.05
# How much longer than --attach-timeout a moving loader is waited for.
_LOADING_GRACE_S = 30.0


def _gil_holder(pid: int, among: FrozenSet[int]) -> Optional[str]:
    try:
        return gil_holder(threads_among(dump(pid, timeout=1.0), among))
    except ProbingError:
        return None


def _attach_errors(pid: int) -> List[str]:
    return [path[: -len(".sock")] + ".attach-error" for path in socket_candidates(pid)]


# With `give_up_early`, a look from outside after this long decides whether to wait on; sooner
# when no thread of the process runs (engine/target.py Stillness): the GIL is then held by a
# blocked thread, and the agent cannot start until it lets go.
_EARLY_LOOK_S = 0.3

# Which thread holds the GIL, read from outside ("thread 'x' holds the GIL in f (file.py:3)"),
# or None, among the given thread ids (the job's before the injection): a caller's own look
# (engine/target.py Target.gil_holder keeps it for its answer).
GilLook = Callable[[FrozenSet[int]], Optional[str]]
# Why waiting on is pointless (no thread of the process runs), or None: engine/target.py
# Stillness.check, called every few milliseconds.
Stuck = Callable[[], Optional[str]]


def attach(
    pid: int, method: str = "auto", timeout: float = 5.0, log: Log = _quiet, give_up_early: bool = False,
    look: Optional[GilLook] = None, stuck: Optional[Stuck] = None,
) -> Attached:  # fmt: skip
    """Make sure `pid` has an agent; returns where it listens.

    `give_up_early`: when the agent is not up after a moment (or no thread of the process
    runs: `stuck` says so) and py-spy shows a thread holding the GIL, stop waiting at once (the
    caller will answer from outside); `look` reads that holder (default: py-spy, the look then
    discarded).
    """
    version = check_target(pid)
    existing = _answering_socket(pid)
    if existing is not None:
        log(f"PID {pid} already has an agent at {existing}")
        return Attached(existing, None, 0.0)
    for stale in _attach_errors(pid):
        if os.path.exists(stale):
            os.unlink(stale)
    started = time.monotonic()
    loading = _Loading(pid)
    jobs_threads = thread_ids(pid) if give_up_early else frozenset()
    report = _inject(pid, method, version, timeout, log)
    injected = time.monotonic()
    early: Optional[_EarlyLook] = None
    if give_up_early:
        looking = look or (lambda among: _gil_holder(pid, among))
        early = _EarlyLook(looking, stuck, injected, log, jobs_threads)
    attached = _wait_for_agent(pid, started + timeout, injected, report, loading, log, early)
    if attached is not None:
        return attached
    raise _timed_out(pid, started, timeout, loading)


def _inject(pid: int, method: str, version: str, timeout: float, log: Log) -> Optional[InjectReport]:
    """Inject the bootstrap that starts the agent, unless one injected earlier still waits for
    the GIL; how the injection went (None: not injected)."""
    report: Optional[InjectReport] = None
    if _injected_by_the_front_end(pid):
        log(f"the native front end injected the helper into PID {pid}; waiting for the agent")
    elif _bootstrap_waiting(pid):
        # Injecting again would only add a second thread waiting for the same GIL.
        log(f"an earlier attach to PID {pid} is still waiting for the GIL; waiting for it")
    else:
        chosen = choose_method(method)
        log(f"attaching to PID {pid} (Python {version}) with {chosen.name}")

        helper = helper_paths(pid)
        if helper.elsewhere:
            log(f"PID {pid} is {helper.elsewhere}: probing copied to {helper.local}")
        report = chosen.inject(pid, timeout, log, helper.local, helper.in_target)
        log(
            f"{report.method}: thread {report.thread} ({report.where}) stopped for "
            f"{report.stopped_ms:.2f} ms; waiting for the agent"
        )
    return report


def _wait_for_agent(
    pid: int, deadline: float, injected: float, report: Optional[InjectReport], loading: _Loading, log: Log,
    early: Optional[_EarlyLook],
) -> Optional[Attached]:  # fmt: skip
    """Wait until the agent listens (past `deadline` while its loader makes headway), the
    attach fails, or the process exits; None when the time is up. `early`: give up as soon as
    a look from outside finds the GIL held (AttachTimeout)."""
    while True:
        loading.look()
        now = time.monotonic()
        if now >= deadline and not (loading.moving() and now < deadline + _LOADING_GRACE_S):
            return None
        path = _answering_socket(pid)
        if path is not None:
            waited = (time.monotonic() - injected) * 1000
            log(f"agent listening at {path}, {waited:.0f} ms after the injection")
            return Attached(path, report, waited)
        for error_file in _attach_errors(pid):
            if os.path.exists(error_file):
                with open(error_file) as reason:
                    raise AttachFailed(f"the agent could not start in PID {pid}: {reason.read().strip()}")
        if not process_alive(pid):
            raise ProcessNotFound(f"PID {pid} exited during the attach")
        if early is not None:
            early.check()
        time.sleep(_POLL_S)


class _EarlyLook:
    """A look from outside while the agent starts, at the job's own threads (`among`, those
    before the injection): as soon as no thread of the process runs, and after _EARLY_LOOK_S
    (once each). A healthy process almost always has one running while its agent loads (the
    loader itself, or a thread it waits for); when a loaded machine finds it still, the loader may
    be holding the GIL in a read, and it is never taken for the job's holder."""

    def __init__(
        self, look: GilLook, stuck: Optional[Stuck], injected: float, log: Log, among: FrozenSet[int]
    ) -> None:
        self.look, self.stuck, self.injected, self.log, self.among = look, stuck, injected, log, among
        self.looked_still = self.looked_late = False

    def check(self) -> None:
        """AttachTimeout when the look finds a thread of the job holding the GIL."""
        if self.looked_late:
            return
        late = time.monotonic() - self.injected > _EARLY_LOOK_S
        still = self.stuck() if self.stuck is not None and not self.looked_still else None
        if still is None and not late:
            return
        if still is not None:
            self.looked_still = True
            self.log(f"the agent is not up and {still}: looking from outside")
        else:
            self.looked_late = True
        holder = self.look(self.among)
        if holder is not None:
            raise AttachTimeout(f"{holder}; {HELD}")


def _timed_out(pid: int, started: float, timeout: float, loading: _Loading) -> AttachTimeout:
    """Why the agent did not come up, as the error that says so."""
    waited = time.monotonic() - started
    within = f"{timeout:g} s" if waited < timeout + 1 else f"{waited:.0f} s"
    if loading.last:
        why = f"its loader got the GIL but makes no headway ({why_no_agent(pid)})"
    else:
        why = why_no_agent(pid)
    return AttachTimeout(
        f"the agent did not come up in PID {pid} within {within}: {why}",
        hint="the job runs on unharmed; the agent starts by itself as soon as the GIL is free, "
        "and the next probing command will use it",
    )
