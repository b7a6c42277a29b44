"""What `probing PID report` shows of one live process, gathered: plain data, no HTML
(cli/pictures/report.py draws it). A record file's is gathered by report_record.py.

The order keeps the page fast and honest: the stacks first (from the agent, or from outside
when it cannot answer: then nothing else that needs the agent is asked, and the page says why),
then the memory summary (object types), then every table the page reads in one connection,
then the hang verdict over a short window (engine/hang.py, the one `probing PID hang` uses).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple

from ...analysis.progress import CodeLine, HangReport, ThreadReport
from ...analysis.states import thread_state
from ...errors import ProbingError
from ...procfs import process_alive, start_time
from ..backtrace import Stacks, read_stacks
from ..hang import sample_hang
from ..query import load_tables
from ..requests import memory, switch
from ..target import Target
from .sources import FILE_BYTES, TOTAL_BYTES, ReportSources, torch_version_of
from .tables import (
    held_tables,
    largest_tensors,
    memory_history,
    nan_events,
    slowest_modules,
    step_times,
    thread_details,
)
from .threads import fold_threads

if TYPE_CHECKING:
    from ...schema.rows import BacktraceRow

    class CodedFrame(BacktraceRow):
        """A python.backtrace row with the source line it stands at (None for a native frame)."""

        code: Optional[str]


# Every table the page reads from a live agent, fetched in one connection.
REPORT_TABLES_SQL = "SELECT 1 FROM python.threads, process.memory, python.torch_trace, python.nan_events"
# python.tensors walks the job's objects in its agent thread and waits for a step boundary to read
# gradients: the report's largest cost to the job's step (see gather_live's `tensors`).
TENSORS_SQL = ", python.tensors"
TORCH_TABLES = ["python.torch_trace", "python.nan_events", "python.tensors"]
OBJECT_TYPES_SHOWN = 15


class Report(NamedTuple):
    """Everything the page shows; a section whose data is None (or empty) is left out, and
    `absent` says why where a reader would look for it."""

    process: Dict[str, Any]  # pid, argv, python_version, torch_version, started_at, uptime_s, rank...
    threads: List[Dict[str, Any]]  # main first: name, ids, state, where, frames (innermost first)
    stacks_source: str  # "agent", "py-spy" or "record"
    hang: Optional[Dict[str, Any]]  # hung, reason, duration_s, samples, took_s (live only)
    record: Optional[Dict[str, Any]]  # path, written_at, reason, exception (a record only)
    steps: List[Dict[str, Any]]
    modules: List[Dict[str, Any]]
    memory: List[Dict[str, Any]]
    nan_events: List[Dict[str, Any]]  # the first few
    nan_steps: List[int]  # every step with a NaN event
    nan_event_count: int
    object_types: List[Dict[str, Any]]
    tensors: List[Dict[str, Any]]
    has_torch: bool
    absent: Dict[str, str]  # section -> why it is not on the page
    notes: List[str]
    timings: Dict[str, float]  # what took how long, seconds
    generated_at: float
    failures: Tuple[str, ...] = ()  # parts left out because a request failed (not "does not apply")
    gone: bool = False  # the process exited (or was replaced) while the report was gathered
    thread_count: int = 0  # threads the process has; `threads` holds them folded and capped
    threads_left_out: int = 0  # past the entries drawn (report_threads.THREADS_SHOWN)


def describe_threads(
    rows: List[CodedFrame],
    state_of: Callable[[List[CodedFrame]], str],
    details: Optional[Dict[Any, Dict[str, Any]]] = None,
) -> List[Dict[str, Any]]:
    """python.backtrace rows as one entry per thread, the main thread first, with its state."""
    by_thread: Dict[Any, List[CodedFrame]] = {}
    for row in rows:
        by_thread.setdefault((row.get("pid"), row.get("thread_id")), []).append(row)
    threads = []
    for frames in by_thread.values():
        frames.sort(key=lambda frame: frame.get("depth") or 0)
        first = frames[0]
        detail = (details or {}).get(first.get("thread_id")) or {}
        python = [frame for frame in frames if frame.get("frame_type") != "Native"]
        where = python[0] if python else first
        cpu = [detail.get("cpu_user_s"), detail.get("cpu_system_s")]
        threads.append({
            "name": first.get("thread_name"),
            "thread_id": first.get("thread_id"),
            "native_id": first.get("native_id"),
            "is_main": bool(first.get("is_main")),
            "daemon": detail.get("daemon"),
            "cpu_s": sum(cpu) if all(isinstance(value, float) for value in cpu) else None,  # type: ignore[arg-type]
            "state": state_of(frames),
            "where": f"{where.get('func')} ({where.get('file')}:{where.get('lineno')})",
            "frames": [
                {key: frame.get(key) for key in ("func", "file", "lineno", "frame_type", "code")}
                for frame in frames
            ],
        })  # fmt: skip
    threads.sort(key=lambda thread: (not thread["is_main"], str(thread["name"])))
    return threads


def judged_threads(
    stacks: Stacks,
    code_line: CodeLine,
    judged: Dict[Tuple[Any, Any], ThreadReport],
    details: Optional[Dict[Any, Dict[str, Any]]] = None,
) -> List[Dict[str, Any]]:
    """A process's threads as the report draws them, with each one's state and activity as the
    hang check judged them where it did (`judged`, by thread and native id), else from its stack."""
    outside = stacks.info.get("outside") or {}

    def state_of(frames: List[CodedFrame]) -> str:
        first = frames[0]
        known = judged.get((first.get("thread_id"), first.get("native_id")))
        if known is not None:
            return known.state
        return thread_state(frames, code_line, outside.get(first.get("native_id")))

    rows: List[CodedFrame] = [
        {**row, "code": code_line(row) if row.get("frame_type") != "Native" else None} for row in stacks.rows
    ]
    threads = describe_threads(rows, state_of, details)
    for thread in threads:
        known = judged.get((thread["thread_id"], thread["native_id"]))
        thread["activity"] = known.activity if known is not None else None
    return threads


def _hang_summary(report: HangReport, took: float) -> Dict[str, Any]:
    return {
        "hung": report.hung,
        "reason": report.reason,
        "duration_s": report.duration_s,
        "samples": report.samples,
        "took_s": took,
        "worker": report.worker,
        "threads": [thread._asdict() for thread in report.threads],
    }


def _process(
    stacks: Stacks, pid: Optional[int], started: Optional[float], now: float, torch_version: Optional[str]
) -> Dict[str, Any]:
    info = stacks.info
    rank = info.get("rank") if isinstance(info.get("rank"), dict) else None
    return {
        "pid": pid or info.get("pid"),
        "argv": [str(arg) for arg in info.get("argv") or []],
        "python_version": info.get("python_version"),
        "executable": info.get("executable"),
        "cwd": info.get("cwd"),
        "probing_version": info.get("probing_version"),
        "torch_version": torch_version,
        "started_at": started,
        "uptime_s": None if started is None else max(0.0, now - started),
        "rank": None if rank is None else rank.get("rank"),
        "local_rank": None if rank is None else rank.get("local_rank"),
        "world_size": None if rank is None else rank.get("world_size"),
        "node": info.get("node") if rank is not None else None,
    }


class _Tables(NamedTuple):
    details: Dict[Any, Dict[str, Any]]
    steps: List[Dict[str, Any]]
    modules: List[Dict[str, Any]]
    memory: List[Dict[str, Any]]
    nans: Tuple[List[Dict[str, Any]], List[int], int]
    tensors: List[Dict[str, Any]]
    held: Set[str]


def _tables(target: Target, timeout: float, notes: List[str], tensors: bool) -> _Tables:
    """Every table the page reads, in one connection. The torch tables are asked for whether or
    not torch is there (they are empty without it): whether it is must not hang on another
    request succeeding."""
    loaded = load_tables(target, REPORT_TABLES_SQL + (TENSORS_SQL if tensors else ""), timeout)
    notes.extend(loaded.notes)
    session = loaded.session
    return _Tables(
        thread_details(session), step_times(session), slowest_modules(session), memory_history(session),
        nan_events(session), largest_tensors(session), held_tables(session, TORCH_TABLES),
    )  # fmt: skip


def _no_steps_yet(target: Target, pid: Optional[int], timeout: float) -> str:
    """Why python.torch_trace is empty while torch is there: tracing off, or on and no step done."""
    try:
        status = switch(target, "trace", {"action": "status"}, timeout)
    except ProbingError as error:
        return f"no traced steps (whether tracing is on could not be read: {error.message})"
    state = status.get("status")  # the agent's answer: {"status": {...}, "hooks_before": ...}
    if isinstance(state, dict) and state.get("trace"):
        return "tracing is on, but no traced step has finished yet"
    return (
        f"no traced steps: `probing {pid or 'PID'} trace on` records them (per module, forward and backward)"
    )


class _Progress:
    """What the gathering has noted so far: the page's notes, the sections left out and why, the
    parts that failed (the command then exits PARTIAL), and what took how long."""

    def __init__(self) -> None:
        self.timings: Dict[str, float] = {}
        self.notes: List[str] = []
        self.absent: Dict[str, str] = {}
        self.failures: List[str] = []

    def failed(self, section: str, why: str) -> None:
        self.absent[section] = why
        self.failures.append(why)


def _no_tables() -> _Tables:
    return _Tables({}, [], [], [], ([], [], 0), [], set())


def _read_tables(target: Target, timeout: float, tensors: bool, progress: _Progress) -> _Tables:
    begun = time.monotonic()
    tables = _no_tables()
    try:
        tables = _tables(target, timeout, progress.notes, tensors)
    except ProbingError as error:
        progress.failed("tables", f"the agent's tables could not be read: {error.message}")
    progress.timings["tables_s"] = time.monotonic() - begun
    return tables


def _object_types(
    target: Target, timeout: float, torch_seen: Optional[bool], progress: _Progress
) -> Tuple[List[Dict[str, Any]], Optional[bool]]:
    """The census of object types, and whether torch is seen now that it has answered."""
    begun = time.monotonic()
    types: List[Dict[str, Any]] = []
    try:
        summary = memory(target, None, False, None, OBJECT_TYPES_SHOWN, timeout, 1.0).result
    except ProbingError as error:
        progress.failed("object_types", f"the memory summary failed: {error.message}")
    else:
        types = list((summary.get("gc") or {}).get("types") or [])
        progress.notes.extend(str(note) for note in summary.get("notes") or [])
        if summary.get("torch") is not None:
            torch_seen = True
        elif torch_seen is None and "tables" not in progress.absent:
            torch_seen = False
    progress.timings["memory_s"] = time.monotonic() - begun
    return types, torch_seen


def _say_why_no_torch_or_steps(
    target: Target, pid: Optional[int], timeout: float, tables: _Tables, torch_seen: Optional[bool],
    progress: _Progress,
) -> None:  # fmt: skip
    absent = progress.absent
    if torch_seen is False:
        absent["torch"] = "torch is not imported in this process"
    elif torch_seen is None:
        absent["torch"] = "whether torch is imported could not be told (the requests that say it failed)"
    elif not tables.steps and "tables" not in absent:
        # No rows, or only those of the step `trace on` came in the middle of (part of a step).
        absent["steps"] = _no_steps_yet(target, pid, timeout)


def _ask_agent(
    target: Target, pid: Optional[int], timeout: float, tensors: bool, torch_seen: Optional[bool],
    progress: _Progress,
) -> Tuple[_Tables, List[Dict[str, Any]], Optional[bool]]:  # fmt: skip
    """The agent's tables, then the object types unless python.tensors has walked the objects
    already; with whether torch is seen (True, False, or None: not known)."""
    tables = _read_tables(target, timeout, tensors, progress)
    if tables.held:
        torch_seen = True
    types: List[Dict[str, Any]] = []
    if tables.tensors:
        # python.tensors has just walked the job's objects; the census would walk them again.
        progress.absent["object_types"] = (
            f"object types are left out so the job's objects are walked once (for the tensors): "
            f"`probing {pid or 'PID'} memory` lists them"
        )
    else:
        types, torch_seen = _object_types(target, timeout, torch_seen, progress)
    _say_why_no_torch_or_steps(target, pid, timeout, tables, torch_seen, progress)
    return tables, types, torch_seen


def _check_hang(
    target: Target, hang_duration: float, hang_samples: int, timeout: float,
    code_line: CodeLine, progress: _Progress,
) -> Tuple[Optional[Dict[str, Any]], Dict[Tuple[Any, Any], ThreadReport]]:  # fmt: skip
    """The hang verdict over `hang_duration` (0: none) as the page shows it, and each thread as
    the check judged it (by thread and native id)."""
    if hang_duration <= 0:
        return None, {}
    begun = time.monotonic()
    hang: Optional[Dict[str, Any]] = None
    hang_report: Optional[HangReport] = None
    try:
        answer = sample_hang(target, hang_duration, hang_samples, timeout, code_line)
    except ProbingError as error:
        progress.failed("hang", f"the hang check failed: {error.message}")
    else:
        hang_report = answer.report
        progress.notes.extend(note for note in answer.notes if note not in progress.notes)
        hang = _hang_summary(answer.report, time.monotonic() - begun)
    progress.timings["hang_s"] = time.monotonic() - begun
    judged = (
        {(thread.thread_id, thread.native_id): thread for thread in hang_report.threads}
        if hang_report
        else {}
    )
    return hang, judged


def gather_live(
    target: Target, timeout: float, hang_duration: float, hang_samples: int, tensors: bool = True
) -> Report:
    """The report of a live process; `hang_duration` 0 leaves the hang verdict out; `tensors`
    False leaves python.tensors out (the census of object types is taken instead). A part that
    fails is left out and named in `failures` (the command then exits PARTIAL); a target that
    cannot be read at all raises."""
    started = time.monotonic()
    progress = _Progress()
    # Only a PID the user named is read in /proc: for a socket target the agent's own claim
    # could name any process (or one of another PID namespace).
    pid = None if target.remote else target.pid
    born = start_time(pid) if pid is not None else None
    stacks = read_stacks(target, False, None, timeout)
    progress.timings["stacks_s"] = time.monotonic() - started
    progress.notes.extend(stacks.notes)
    sources = ReportSources(pid)

    def code_line(frame: BacktraceRow) -> str:
        return sources.line(str(frame.get("file")), frame.get("lineno"))

    from_outside = any(row.get("source") == "py-spy" for row in stacks.rows)
    torch_version = torch_version_of(pid)
    # True, False, or None: not known (a request failed and nothing else told).
    torch_seen: Optional[bool] = True if torch_version else None
    tables = _no_tables()
    types: List[Dict[str, Any]] = []
    if from_outside:
        why = stacks.notes[0] if stacks.notes else "the agent could not answer"
        progress.absent["agent"] = (
            f"{why}. Memory, step times, modules, NaN events and tensors come from the agent, "
            "so they are left out"
        )
    else:
        tables, types, torch_seen = _ask_agent(target, pid, timeout, tensors, torch_seen, progress)
    hang, judged = _check_hang(target, hang_duration, hang_samples, timeout, code_line, progress)
    threads = judged_threads(stacks, code_line, judged, tables.details)
    if sources.left_unread:
        progress.notes.append(
            f"{sources.left_unread} source files were not read (over {FILE_BYTES >> 20} MB, "
            f"or past the {TOTAL_BYTES >> 20} MB a report reads)"
        )
    # Gone: exited (a zombie not yet reaped has), or its PID is another process's now.
    gone = pid is not None and progress.failures != [] and (not process_alive(pid) or start_time(pid) != born)
    shown, left_out = fold_threads(threads)
    now = time.time()
    progress.timings["total_s"] = time.monotonic() - started
    (nans, nan_steps, nan_count) = tables.nans
    return Report(
        process=_process(stacks, pid, born, now, torch_version),
        threads=shown, stacks_source="py-spy" if from_outside else "agent", hang=hang,
        record=None, steps=tables.steps, modules=tables.modules, memory=tables.memory, nan_events=nans,
        nan_steps=nan_steps, nan_event_count=nan_count, object_types=types, tensors=tables.tensors,
        has_torch=bool(torch_seen), absent=progress.absent, notes=progress.notes, timings=progress.timings,
        generated_at=now, failures=tuple(progress.failures), gone=gone, thread_count=len(threads),
        threads_left_out=left_out,
    )  # fmt: skip
