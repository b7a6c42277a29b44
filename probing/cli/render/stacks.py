"""The stacks any kind of target answered (engine/kinds), each shape to its writer: one process
(and its descendants), the ranks of a job, a record, a core file."""

from __future__ import annotations

# No typing at run time, and each shape's writer loaded when one is written: `probing PID
# backtrace` starts through here (cli/fast.py; CONTRIBUTING.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def write_stacks(answer: Any, format: str) -> None:
    from ...engine.kinds import Ranks

    if isinstance(answer, Ranks):
        from .per_rank import write_job_stacks

        write_job_stacks(answer.job, answer.gathered, format)
        return
    value = answer.value
    from ...engine.backtrace import TreeStacks

    if isinstance(value, TreeStacks):
        from .backtrace import write_tree

        write_tree(value, format)
        return
    from ...engine.kinds.record import FromRecord

    if isinstance(value, FromRecord):
        from .record import write_record_stacks

        write_record_stacks(value.record, value.value, format)
        return
    from .core import write_core

    write_core(value, format)
