"""`probing PID backtrace`: every thread's stack, read like a traceback.

Click-free: the fast path (cli/fast.py) calls it directly; cli/group.py builds the click
command from the options cli/spec.py declares.
"""

from __future__ import annotations

from ..engine.backtrace import read_stacks_of_ranks, read_tree, stacks_deadline
from ..errors import ExitCode, UsageError
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
    ranks: Optional[str] = None,
) -> int:
    record = invocation.record()
    if record is not None:
        from ..engine.record import record_stacks
        from .render.record import write_record_stacks

        live = [name for name, given in (("--ranks", ranks is not None), ("--native", native),
                                          ("--children", children or attach_children)) if given]  # fmt: skip
        if live:
            raise invocation.live_only(f"backtrace {live[0]}")
        write_record_stacks(record, record_stacks(record, locals, thread), format)
        return ExitCode.OK
    if ranks is not None:
        if children or attach_children:
            raise UsageError("--ranks reads every rank already; --children does not go with it")
        from .render.per_rank import write_job_stacks

        job, chosen = invocation.job(ranks)
        gathered = read_stacks_of_ranks(
            chosen, invocation.rank_target, locals, thread, timeout,
            stacks_deadline(timeout, invocation.attach_timeout), native,
        )  # fmt: skip
        write_job_stacks(job, gathered, format)
        return gathered.exit_code()
    tree = read_tree(invocation.target(), locals, thread, timeout, native, children, attach_children)
    write_tree(tree, format)
    return ExitCode.OK
