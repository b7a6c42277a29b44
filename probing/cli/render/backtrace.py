"""Stacks read like Python tracebacks: one process, or a process tree with its notes."""

from __future__ import annotations

import sys

from . import inert, note

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any, Dict

    from ...engine.backtrace import Stacks, TreeStacks
    from ...engine.shown import ShownThread


# The layout, one template a line: each field is written through `inert`. The native front end
# fills the same templates (native/front/gen_tables.py turns them into its tables).
PROCESS_LINE = "Process {pid} (Python {python}): {argv}\n"
THREAD_GAP = "\n"
THREAD_LINE = 'Thread {number}"{name}"{main}: {state} (most recent call last):\n'
NUMBERED = "{id} "
MAIN_THREAD = ", main thread"
NATIVE_FRAME = "  [native] {func} in {file}\n"
PYTHON_FRAME = '  File "{file}", line {lineno}, in {func}\n'
UNKNOWN_LINENO = "?"
CODE_LINE = "    {code}\n"
LOCAL_LINE = "      {name} = {value}\n"
NO_THREADS = "\n(no Python threads)\n"
# A thread running an asyncio loop: its loop's tasks after its frames, each indented under the
# task that awaits it (`indent`: two spaces a level), parents first.
TASKS_LINE = "  asyncio tasks of its event loop: {count}\n"
TASK_LINE = '{indent}  Task "{name}" ({coroutine}): {state}\n'
TASK_FRAME = '{indent}    File "{file}", line {lineno}, in {func}\n'
TASK_CODE = "{indent}      {code}\n"
MORE_TASKS = "  ... and {count} more tasks: {where}\n"
# A loop's thread read from outside (the agent could not answer): only the agent reads tasks.
TASKS_UNREAD = "  asyncio tasks of its event loop: unread from outside (only its agent reads them)\n"


def fill(template: str, **fields: Any) -> str:
    """`template` with each field's value made inert."""
    return template.format(**{name: inert(value) for name, value in fields.items()})


def write_backtrace_text(stacks: Stacks, out: IO[str]) -> None:
    """Threads grouped, main thread first, each read like a Python traceback and headed by
    what it is doing (the engine worked all of it out: engine/shown.py)."""
    write_heading(stacks.pid, stacks.info, out)
    for thread in stacks.threads:
        out.write(THREAD_GAP)
        write_thread(thread, out)
    if not stacks.threads:
        out.write(NO_THREADS)


def write_heading(host_pid: Any, info: Dict[str, Any], out: IO[str]) -> None:
    """The process's line: its PID (and the one it has in its own namespace), Python, argv."""
    pid = info.get("pid")
    shown = f"{host_pid} (PID {pid} in its namespace)" if host_pid and host_pid != pid else pid
    argv = " ".join(str(arg) for arg in info.get("argv") or [])
    out.write(fill(PROCESS_LINE, pid=shown, python=info.get("python_version"), argv=argv))


def write_thread(thread: ShownThread, out: IO[str], numbered: bool = True) -> None:
    """One thread: its heading (without its number: the same thread of several ranks), then its
    frames, outermost first."""
    main = MAIN_THREAD if thread.is_main else ""
    number = fill(NUMBERED, id=thread.native_id) if numbered else ""
    name, state = inert(thread.name), inert(thread.state)
    out.write(THREAD_LINE.format(number=number, name=name, main=main, state=state))
    for frame in thread.frames:
        if frame.native:
            out.write(fill(NATIVE_FRAME, func=frame.func, file=frame.file))
            continue
        lineno = frame.lineno if frame.lineno is not None else UNKNOWN_LINENO
        out.write(fill(PYTHON_FRAME, file=frame.file, lineno=lineno, func=frame.func))
        if frame.code:
            out.write(fill(CODE_LINE, code=frame.code))
        for name, value in frame.locals:
            out.write(fill(LOCAL_LINE, name=name, value=value))
    if thread.task_count:
        write_tasks(thread, out)
    elif thread.tasks_unread:
        out.write(TASKS_UNREAD)


def write_tasks(thread: ShownThread, out: IO[str]) -> None:
    """The tasks of a thread's asyncio loop, each with its await chain outermost first."""
    out.write(fill(TASKS_LINE, count=thread.task_count))
    for task in thread.tasks:
        indent = "  " * task.level
        out.write(fill(TASK_LINE, indent=indent, name=task.name, coroutine=task.coroutine, state=task.state))
        for frame in task.frames:
            lineno = frame.lineno if frame.lineno is not None else UNKNOWN_LINENO
            out.write(fill(TASK_FRAME, indent=indent, file=frame.file, lineno=lineno, func=frame.func))
            if frame.code:
                out.write(fill(TASK_CODE, indent=indent, code=frame.code))
    more = thread.task_count - len(thread.tasks)
    if more > 0:
        out.write(fill(MORE_TASKS, count=more, where=thread.more_tasks))


def write_tree(tree: TreeStacks, format: str) -> None:
    """`probing PID backtrace [--children]`: what could not be read and why the answer came
    from outside (stderr), then every process's stacks (stdout)."""
    for pid, command, error in tree.failed:
        note(f"PID {pid} ({command}): {error.message}")
    for stacks in tree.processes:
        for message in stacks.notes:
            note(f"PID {stacks.info.get('pid')}: {message}")
    sys.stderr.flush()
    out = sys.stdout
    if format == "text":
        for index, stacks in enumerate(tree.processes):
            if index:
                out.write("\n")
            write_backtrace_text(stacks, out)
        return
    from ...schema.rows import backtrace_values_of
    from ...schema.tables import BACKTRACE
    from .rows import write_rows

    names = BACKTRACE.column_names()
    types = [column.type for column in BACKTRACE.columns]
    every = [backtrace_values_of(row) for stacks in tree.processes for row in stacks.rows]
    write_rows(names, types, every, format, out)


def write_stacks_to_stderr(stacks: Stacks) -> None:
    """One process's stacks on stderr (the run watchdog's dump of a hung job)."""
    sys.stderr.write("\n")
    write_backtrace_text(stacks, sys.stderr)
