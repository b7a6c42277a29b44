"""`probing TARGET backtrace`: every thread's stack, read like a traceback.

Click-free: the fast path (cli/fast.py) calls it directly; cli/group.py builds the click
command from the options cli/spec.py declares.
"""

from __future__ import annotations

from .render.stacks import write_stacks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

    from .invocation import Invocation


def backtrace(
    invocation: Invocation,
    locals: bool,
    thread: Optional[str],
    format: str,
    timeout: float,
    native: bool = False,
    children: bool = False,
    attach_children: bool = False,
    ranks: Optional[str] = None,
) -> int:
    answer = invocation.kind(ranks).stacks(locals, thread, timeout, native, children, attach_children)
    write_stacks(answer, format)
    return answer.exit_code
