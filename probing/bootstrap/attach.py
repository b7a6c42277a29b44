"""Run inside a process probing attached to, by the helper library's own thread (holding
the GIL; never a thread the injector stopped), in a namespace of its own. pyrasite runs it on
a thread of the job instead (the one gdb stopped) and says so with `_PROBING_ON_A_JOB_THREAD`:
that thread lives on, so it is neither left out of backtraces nor forgotten as one ending.

Starts the agent from this install (loader.py). If it cannot, it leaves the reason in
`<socket dir>/<pid>.attach-error` for the CLI to report. Never raises, never prints.
"""

import os
import sys

# While the agent loads, threads hand the GIL over every 0.5 ms instead of 5 ms. Loading
# means dozens of file-system calls, each of which releases the GIL; in a process whose
# thread spins in Python, each then waits a whole switch interval to get it back (the
# attach to a busy Python 3.8 loop took over half a second). The job's own setting is put
# back as soon as the agent listens.
_FAST_SWITCH_INTERVAL = 0.0005


def _attach() -> None:
    on_a_job_thread = bool(globals().get("_PROBING_ON_A_JOB_THREAD"))
    here = os.path.dirname(os.path.abspath(__file__))
    loader: dict = {}  # type: ignore[type-arg]
    with open(os.path.join(here, "loader.py"), "rb") as source:
        exec(compile(source.read(), source.name, "exec"), loader)
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, _FAST_SWITCH_INTERVAL))
    try:
        # Someone connects as soon as the socket listens: the request handlers are loaded
        # first, not on their clock. The CLI takes a listening socket for an agent that is up;
        # in a job whose threads hold the GIL in long stretches (a gc.collect() loop), loading
        # them afterwards kept the first request waiting past its timeout.
        problem = loader["start_agent"](
            os.path.dirname(here), ("probing.agent.handlers",), not on_a_job_thread
        )
        if problem is None:
            return
    finally:
        if sys.getswitchinterval() == min(previous, _FAST_SWITCH_INTERVAL):
            sys.setswitchinterval(previous)
        if not on_a_job_thread:
            loader["forget_this_thread"]()
    directory = os.environ.get("PROBING_SOCKET_DIR") or f"/tmp/probing-{os.geteuid()}"
    try:
        with open(os.path.join(directory, f"{os.getpid()}.attach-error"), "w") as report:
            report.write(problem)
    except OSError:
        pass


try:
    _attach()
except Exception:  # noqa: BLE001 - the job must never see our failure
    pass
