"""`hang` of a process reached over TCP, in one request: its agent samples its own stacks over
the window and reads its threads' counters on its own node (agent/watch.py), and the samples come
back at once. Per sample, the same rows and counters as a backtrace and a python.threads table
asked each time would give, without a round trip per sample (through a node's relay, a batch
for every rank of the node per sample: at 1 024 ranks those rounds were the whole cost).

The reply is the job's, untrusted: every sample's row range, time and counters are checked, and
a reply that does not hold together is a BadReply, never a verdict on half of it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, cast

from ..analysis.progress import Sample
from ..client.replies import decode_reply_table
from ..errors import BadReply, RequestRefused
from ..schema.tables import ASYNCIO_TASKS, BACKTRACE

if TYPE_CHECKING:
    from ..schema.rows import AsyncioTasksRow, BacktraceRow
    from .target import Target

# What the window may take beyond its duration: the agent's last sample and the reply's way back.
WATCH_SLACK_S = 5.0


class Watched:
    """The samples an agent took of its process, and the notes it sent with them."""

    __slots__ = ("pid", "samples", "notes", "tables")

    def __init__(
        self, pid: int, samples: List[Sample], notes: List[str], tables: Dict[str, Optional[List[Any]]]
    ) -> None:
        self.pid = pid
        self.samples = samples
        self.notes = notes
        self.tables = tables  # name -> rows of each table asked for after the window; None: not given


def watch_remote(
    target: Target,
    duration: float,
    samples: int,
    timeout: float,
    tables: Sequence[str] = (),
    table_params: Optional[Dict[str, Any]] = None,
) -> Optional[Watched]:
    """The samples of `target`'s agent over `duration` seconds, and the `tables` it builds once
    the window is over (in the same reply: hang's collectives cost no more round trips); None
    when the agent has no `watch` (an older one): then the caller asks it sample by sample."""
    params = {"duration": duration, "samples": max(2, samples), "tables": list(tables),
              "table_params": table_params or {}}  # fmt: skip
    asked_at = time.monotonic()
    try:
        with target.connect(timeout) as client:
            result, payload = client.call("watch", params, timeout=duration + timeout + WATCH_SLACK_S)
    except RequestRefused as error:
        if "unknown method" not in error.message:
            raise
        target.log(f"its agent has no `watch`: sampling it request by request ({error.message[:120]})")
        return None
    if not isinstance(result, dict):
        raise BadReply("the agent's answer to 'watch' is not an object")
    pid = result.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise BadReply("the agent's answer to 'watch' names no PID")
    rows = cast("List[BacktraceRow]", _table(result, payload, "table", BACKTRACE.name))
    offset = result.get("tasks_offset", 0)
    if not isinstance(offset, int) or not 0 <= offset <= len(payload):
        raise BadReply("the agent's answer to 'watch' puts its tasks outside its payload")
    tasks = cast("List[AsyncioTasksRow]", _table(result, payload[offset:], "tasks", ASYNCIO_TASKS.name))
    taken = result.get("samples")
    if not isinstance(taken, list) or not 2 <= len(taken) <= max(2, samples):
        count = len(taken) if isinstance(taken, list) else "no list of"
        raise BadReply(f"the agent's answer to 'watch' holds {count} samples, asked for {samples}")
    built = [_sample(each, rows, tasks, asked_at) for each in taken]
    notes = [note for note in result.get("notes") or () if isinstance(note, str)][:20]
    return Watched(pid, built, notes, _tables_after(result, payload, tables, notes))


def _tables_after(
    result: Dict[str, Any], payload: bytearray, asked: Sequence[str], notes: List[str]
) -> Dict[str, Optional[List[Any]]]:
    """Each table asked for: its rows, or None with a note of why the agent gave none."""
    given = result.get("tables") or []
    if not isinstance(given, list) or len(given) != len(asked):
        count = len(given) if isinstance(given, list) else "no"
        raise BadReply(f"the agent's answer to 'watch' holds {count} of the {len(asked)} tables asked for")
    tables: Dict[str, Optional[List[Any]]] = {}
    for name, entry in zip(asked, given):
        if not isinstance(entry, dict) or entry.get("name") != name:
            raise BadReply(f"the agent's answer to 'watch' gives another table where {name} was asked for")
        if "table" not in entry:
            notes.append(f"no {name}: {str(entry.get('error'))[:200]}")
            tables[name] = None
            continue
        offset = entry.get("offset")
        if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= len(payload):
            raise BadReply(f"the agent's answer to 'watch' puts {name} outside its payload")
        tables[name] = _table(entry, payload[offset:], "table", name)
    return tables


def _table(result: Dict[str, Any], payload: Any, key: str, name: str) -> List[Dict[str, Any]]:
    """The rows of the table `result[key]` (none when the agent sent none), checked to be `name`."""
    if key not in result:
        return []
    table = decode_reply_table({"table": result[key]}, bytearray(payload))
    if table.name != name:
        raise BadReply(f"the agent's answer to 'watch' holds table {table.name!r}, not {name}")
    return table.to_rows()


def _span(value: Any, rows: int) -> Tuple[int, int]:
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(end, int) and not isinstance(end, bool) for end in value)
        and 0 <= value[0] <= value[1] <= rows
    ):
        return value[0], value[1]
    raise BadReply(f"a sample of the agent's answer to 'watch' names rows {str(value)[:60]} of {rows}")


def _sample(each: Any, rows: List[Any], tasks: List[Any], asked_at: float) -> Sample:
    if not isinstance(each, dict) or not isinstance(each.get("taken"), (int, float)):
        raise BadReply("a sample of the agent's answer to 'watch' says not when it was taken")
    start, end = _span(each.get("rows"), len(rows))
    task_start, task_end = _span(each["tasks"], len(tasks)) if each.get("tasks") is not None else (0, 0)
    counters: Dict[Any, Tuple[Optional[int], Optional[int]]] = {}
    for native, pair in (each.get("counters") or {}).items():
        if not (isinstance(native, str) and native.isdigit() and isinstance(pair, list) and len(pair) == 2):
            raise BadReply("a sample of the agent's answer to 'watch' has unreadable counters")
        ticks, wakeups = (value if isinstance(value, int) and not isinstance(value, bool) else None
                          for value in pair)  # fmt: skip
        counters[int(native)] = (ticks, wakeups)
    return Sample(
        asked_at + float(each["taken"]), rows[start:end], counters, None, tasks[task_start:task_end]
    )
