"""`probing PID backtrace`: every thread's stack, read like a traceback.

Click-free: the fast path (cli/fast.py) calls it directly; cli/group.py builds the click
command from the options cli/spec.py declares.
"""

from __future__ import annotations

from ..engine.backtrace import read_tree
from ..errors import ExitCode
from .render.backtrace import write_tree

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
) -> int:
    tree = read_tree(invocation.target(), locals, thread, timeout, native, children, attach_children)
    write_tree(tree, format)
    return ExitCode.OK
