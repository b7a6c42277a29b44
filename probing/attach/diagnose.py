"""Why an agent did not come up: read from outside the process, with py-spy."""

from __future__ import annotations

from ..errors import ProbingError
from ..outside.pyspy import dump, gil_holder
from ..procfs import process_alive


def why_no_agent(pid: int) -> str:
    if not process_alive(pid):
        return "the process exited"
    try:
        holder = gil_holder(dump(pid))
    except ProbingError as error:
        return f"{error.message} (is py-spy installed?)"
    if holder is not None:
        return f"{holder} and has not released it"
    return "no thread holds the GIL, yet the agent's thread did not run (is the interpreter shutting down?)"
