"""Threads the agent starts: none of them runs the job's tracer or profiler.

`threading.settrace` and `threading.setprofile` (`python -m trace`, coverage's PyTracer, a
pure-Python debugger) are installed by threading in every thread started after them, the
agent's included. A tracer is job code: in an agent thread it slows every request down, can
stall one (a job that traced its new threads never got its `hello` answered), and it hands the
GIL over between any two lines, where the 3.11 frame reader (evaluate/framelocals.py) must keep
it. So each agent thread clears both before it runs anything else, and the line tracer that
`run` itself was given. The tracer still sees one `call` event per agent thread (threading
installs it before `run` starts). `sys.monitoring` (3.12+) belongs to the interpreter, not to a
thread, and is left alone.
"""

from __future__ import annotations

import sys
import threading


class AgentThread(threading.Thread):
    """A thread of the agent's: threading.Thread, run with no tracer and no profiler."""

    def run(self) -> None:
        sys.settrace(None)
        sys.setprofile(None)
        sys._getframe().f_trace = None  # this frame's line events, from the tracer's `call`
        super().run()
