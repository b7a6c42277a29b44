"""`probing` command line entry point.

`main` keeps `probing PID backtrace` off click (and everything else heavy): see cli/spec.py.
"""

from __future__ import annotations

import os
import sys

from ..errors import ExitCode, ProbingError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    # The native front end's py-spy (outside/spawn.py HANDED_OVER) is this command's alone:
    # taken out of the environment before anything runs, and its pipes and process released if
    # nothing read them. Without one, spawn (and its imports) stays off the fast path.
    if "PROBING_PYSPY" not in os.environ:
        return _run(args)
    from ..outside.spawn import HandOverScope

    with HandOverScope():
        return _run(args)


def _run(args: List[str]) -> int:
    from . import render

    try:
        from .fast import parse_backtrace

        fast = parse_backtrace(args)
        if fast is not None:
            from .backtrace import backtrace
            from .invocation import Invocation

            invocation = Invocation(
                fast.pop("target"), fast.pop("verbose"), fast.pop("no_attach"), fast.pop("attach_timeout")
            )
            invocation.command = "backtrace"
            return backtrace(invocation, **fast)
        from .group import run_click

        return run_click(args)
    except ProbingError as error:
        return render.report_error(error)
    except BrokenPipeError:
        render.stdout_is_closed()
        return ExitCode.OK
    except KeyboardInterrupt:
        return 130
