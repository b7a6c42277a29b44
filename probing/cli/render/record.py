"""How a record prints: the heading (whose it is, when and why it was written, the exception
that ended the job) above its stacks; its memory history; its one-snapshot hang report; what
`export` wrote; what `probing PID record` wrote.

Every string of a record is the job's (untrusted): it goes through `inert` or an inert stream.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from ...engine.backtrace import Stacks, TreeStacks
from ...errors import ProbingError
from . import inert, inert_lines, inert_stream, notes
from .backtrace import write_tree
from .json_writer import write_json
from .memory import size
from .rows import write_table

if TYPE_CHECKING:
    from ...engine.records.record import Record
    from ...engine.records.sql import Exported

# Of the records agents removed lately, `probing records` shows this many (the newest).
PRUNED_SHOWN = 10
REASONS = {
    "exception": "an uncaught exception",
    "signal": "a signal",
    "fatal_signal": "a fatal signal",
    "nan": "a NaN/Inf (nan on --stop)",
    "watchdog": "the hang watchdog (run --hang-timeout)",
    "collective_timeout": "a collective timeout",
    "on_demand": "a request (probing PID record)",
    "exit": "an exit with an error status",
}


def when(seconds: Optional[float]) -> str:
    """A time the job wrote, as a local date; "?" for none, and for a value that is no time the
    clock can show (the engine passes only times: this is the last guard of the printer)."""
    if seconds is None:
        return "?"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
    except (OverflowError, ValueError, OSError):
        return "?"


def signal_name(number: Optional[int]) -> str:
    if number is None:
        return ""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def why(record: Record) -> str:
    """Why the record was written, in one line."""
    reason = record.reason()
    kind = reason["kind"]
    text = REASONS.get(kind or "", kind or "unknown")
    details = [signal_name(reason["signal"])]
    if reason["exit_status"] is not None:
        details.append(f"exit status {reason['exit_status']}")
    details = [detail for detail in details if detail]
    if details:
        text += f" ({', '.join(details)})"
    if reason["message"]:
        text += f": {reason['message']}"
    return text


def write_heading(record: Record, out: IO[str]) -> None:
    """Whose record it is, when and why it was written, its rank, and what was left out."""
    written = "faulthandler wrote" if record.kind == "fatal" else "written"
    out.write(
        f"Record {inert(record.path)}: {written} {when(record.written_at)} because of {inert(why(record))}\n"
    )
    rank = record.rank()
    if rank is not None and rank["rank"] is not None:
        out.write(
            f"  rank {rank['rank']} of {rank['world_size']} (local rank {rank['local_rank']}, "
            f"node {rank['node']})\n"
        )
    for message in record.notes:
        out.write(f"  note: {inert(message)}\n")


def write_record_stacks(record: Record, stacks: Stacks, format: str) -> None:
    """`probing FILE backtrace`: the heading and the exception with its traceback (text), then
    the stacks at the end as the live command prints them."""
    tree = TreeStacks()
    tree.processes.append(stacks)
    if format != "text":
        write_tree(tree, format)
        return
    out = sys.stdout
    write_heading(record, out)
    exception = record.exception()
    if exception is not None:
        thread = f" in thread {inert(exception['thread'])}" if exception["thread"] else ""
        out.write(f"\nThe exception that ended it{thread}:\n")
        text = exception["text"] or f"{exception['type']}: {exception['message']}\n"
        out.write(inert_lines(text if text.endswith("\n") else text + "\n", out))
    out.write("\nThe stacks when it was written:\n")
    write_tree(tree, "text")


def write_record_memory(report: Dict[str, Any], format: str) -> None:
    if format == "json":
        write_json(report)
        return
    out = inert_stream(sys.stdout)
    out.write(f"PID {report['pid']}, record {report['record']} (written {when(report['written_at'])})\n")
    first, peak, last = report["first"], report["peak"], report["last"]
    if last is None:
        out.write("  process.memory: no samples in this record\n")
    else:
        span = (last["ts"] or 0) - (first["ts"] or 0)
        out.write(
            f"  RSS at the end {size(last.get('rss_mb'))}, peak {size(peak.get('rss_mb'))} at "
            f"{when(peak.get('ts'))}, first sample {size(first.get('rss_mb'))}: {report['samples']} samples "
            f"over {span:.0f} s\n"
        )
        if last.get("cuda_allocated_mb") is not None:
            out.write(
                f"  CUDA at the end: {size(last['cuda_allocated_mb'])} allocated, "
                f"{size(last.get('cuda_reserved_mb'))} reserved\n"
            )
        out.write(f"\nThe last {len(report['history'])} samples of process.memory:\n")
        columns = ["time", "rss", "vms", "cpu", "threads", "fds", "gc objects"]
        rows = [
            (
                when(row.get("ts")), size(row.get("rss_mb")), size(row.get("vms_mb")),
                "?" if row.get("cpu_percent") is None else f"{row['cpu_percent']:.0f}%",
                row.get("num_threads"), row.get("num_fds"), row.get("gc_objects"),
            )
            for row in report["history"]
        ]  # fmt: skip
        write_table(columns, ["VARCHAR"] * len(columns), rows, out)
    torch = report["torch"]
    if torch is not None and any(
        torch[name] is not None for name in ("allocated", "max_allocated", "reserved")
    ):
        out.write(
            f"\ntorch at the last traced step ({torch['step']}): allocated {size(torch['allocated'])}, "
            f"max allocated {size(torch['max_allocated'])}, reserved {size(torch['reserved'])}\n"
        )
    held = ", ".join(
        f"{name} ({rows:,} row{'' if rows == 1 else 's'})" for name, rows in report["tables"].items()
    )
    out.write(f"\nThe record holds: {held or 'no table'}\n")
    out.write(
        "A record is what the job left: USS, an object scan and --growth need a live process "
        "(`probing FILE query` reads every table it holds).\n"
    )


def write_record_hang(report: Dict[str, Any], format: str) -> None:
    if format == "json":
        write_json(report)
        return
    out = sys.stdout
    verdict = "hung" if report["hung"] else "not known to be hung"
    out.write(
        f"PID {inert(report['pid'])} (record {inert(report['record'])}) was {verdict}: "
        f"{inert(report['reason'])}\n\n"
    )
    columns = ["thread", "state", "where"]
    rows = [
        (f"{thread['name']}{' (main)' if thread['is_main'] else ''}", thread["state"], thread["where"])
        for thread in report["threads"]
    ]
    write_table(columns, ["VARCHAR"] * len(columns), rows, out)


def write_exported(exported: Exported, format: str) -> None:
    if format == "json":
        write_json({"directory": exported.directory, "files": exported.files})
        return
    out = sys.stdout
    for entry in exported.files:
        rows = entry["rows"]
        what = "the record's header" if rows is None else f"{rows:,} row{'' if rows == 1 else 's'}"
        out.write(f"{inert(entry['path'])}  {what}, {size(entry['bytes'] / 1048576)}\n")


def write_records(
    entries: List[Any], format: str, directories: List[str], pruned: Sequence[Any] = ()
) -> None:
    """`probing records`: newest first; where it looked, when it found none; then the newest
    PRUNED_SHOWN records the agents removed, each with why (JSON: all of them, kind "pruned")."""
    fields = ["written", "pid", "rank", "argv", "why", "size", "path"]
    if format == "json":
        write_json([dict(entry._asdict(), size_bytes=entry.size) for entry in [*entries, *pruned]])
        return
    if not entries:
        sys.stdout.write(f"no records in {inert(', '.join(directories))}\n")
    else:
        rows = [
            (
                when(entry.written_at), entry.pid, entry.rank, _short(" ".join(entry.argv), 40),
                _short(entry.reason, 60), size(entry.size / 1048576), entry.path,
            )
            for entry in entries
        ]  # fmt: skip
        write_table(fields, ["VARCHAR"] * len(fields), rows, sys.stdout)
    if pruned:
        shown = pruned[:PRUNED_SHOWN]
        more = ""
        if len(pruned) > len(shown):
            more = f" (the newest {len(shown)} of {len(pruned)}: --format json lists them all)"
        sys.stdout.write(f"\nremoved to keep the directory within its bounds{more}:\n")
        for entry in shown:
            sys.stdout.write(
                f"  {inert(entry.path)} ({size(entry.size / 1048576)}, written {when(entry.written_at)}): "
                f"{inert(entry.reason)}\n"
            )


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def write_recorded(result: Dict[str, Any], format: str) -> None:
    """`probing PID record`: what the agent wrote."""
    if format == "json":
        write_json(result)
        return
    notes(result.get("notes") or [])
    sys.stdout.write(
        f"PID {inert(result['pid'])}: {inert(result['path'])} ({size((result.get('bytes') or 0) / 1048576)}, "
        f"written in {float(result.get('seconds') or 0):.3f} s)\n"
    )


def write_not_recorded(pid: Optional[int], error: ProbingError, format: str) -> None:
    """`probing PID record --format json` when the agent could write no record: what it said, as
    JSON on stdout (the error itself goes to stderr, as for every command)."""
    if format == "json":
        write_json({"pid": pid, "path": None, "error": error.message, "exit_code": int(error.exit_code)})


def write_recorded_ranks(answers: List[Any], format: str, missing: Sequence[Any] = ()) -> None:
    """`probing PID record --ranks`: what each rank's agent wrote, by rank; as JSON, the ranks that
    wrote none too, each with its error and exit code."""
    if format == "json":
        entries = [dict(result, rank=rank.rank) for rank, result in answers]
        for each in missing:
            error = each.error
            entries.append(
                {
                    "rank": each.rank.rank,
                    "path": None,
                    "error": error.message,
                    "exit_code": int(error.exit_code),
                }
            )
        write_json(sorted(entries, key=lambda entry: (entry["rank"] is None, entry["rank"] or 0)))
        return
    for rank, result in answers:
        sys.stdout.write(f"rank {rank.rank}: ")
        write_recorded(result, "text")
