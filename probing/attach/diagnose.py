"""Why an agent did not come up: read from outside the process, with py-spy."""

from __future__ import annotations

from ..errors import ProbingError
from ..outside.pyspy import dump, gil_holder
from ..procfs import process_alive, running_threads


def why_no_agent(pid: int) -> str:
    if not process_alive(pid):
        return "the process exited"
    try:
        holder = gil_holder(dump(pid))
    except ProbingError as error:
        return f"{error.message} (is py-spy installed?)"
    if holder is not None:
        return f"{holder} and has not released it"
    if running_threads(pid):
        # The GIL passes between the job's threads (each of a gc.collect() loop's turns can
        # last a second on a loaded machine): the agent's thread has not had its turn yet.
        return (
            "the job's threads run and pass the GIL between them, but the agent's thread has not "
            "had its turn yet (a busy job on a loaded machine: --attach-timeout gives it longer)"
        )
    return "no thread holds the GIL, yet the agent's thread did not run (is the interpreter shutting down?)"
