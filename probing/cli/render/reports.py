"""What the commands other than backtrace and query print: tables, attach, hang, eval,
trace/nan switches, detach, and `probing run`'s own lines."""

from __future__ import annotations

import sys
from typing import IO, Any, Dict, List, Optional

from ...errors import ProbingError
from . import inert, inert_lines, notes
from .backtrace import write_backtrace_text, write_stacks_to_stderr
from .files import counted, write_output
from .json_writer import dumps, write_json
from .nan import nan_session_lines
from .rows import write_table


def write_tables(tables: List[Dict[str, Any]], format: str) -> None:
    if format == "json":
        write_json(tables)
        return
    out = sys.stdout
    for index, table in enumerate(tables):
        if index:
            out.write("\n")
        out.write(f"{inert(table['name'])}: {inert(table.get('doc', ''))}\n")
        # default: a table may have no columns (a hostile agent's description).
        name_width = max((len(inert(column["name"])) for column in table["columns"]), default=0)
        type_width = max((len(inert(column["type"])) for column in table["columns"]), default=0)
        for column in table["columns"]:
            name, kind = inert(column["name"]).ljust(name_width), inert(column["type"]).ljust(type_width)
            out.write(f"  {name}  {kind}  {inert(column.get('doc', ''))}\n")


def write_attach(pid: int, attached: Any, format: str) -> None:
    out = sys.stdout
    report = attached.report
    if format == "json":
        fields = report._asdict() if report is not None else {"method": None}
        write_json(
            {"pid": pid, "socket": attached.socket, "waited_ms": attached.waited_ms, **fields}, indent=None
        )
        return
    if report is None and attached.waited_ms:
        out.write(f"PID {pid}: the agent of an earlier attach came up at {attached.socket}\n")
        return
    if report is None:
        out.write(f"PID {pid} already has an agent: {attached.socket}\n")
        return
    if isinstance(report.thread, int):
        held = f"thread {report.thread} ({report.where}) was stopped for {report.stopped_ms:.2f} ms"
    else:
        by = "gdb" if report.method == "gdb" else f"{report.method}'s gdb"
        held = f"every thread was stopped by {by} for up to {report.stopped_ms:.0f} ms"
    out.write(
        f"PID {pid}: attached with {report.method}; {held}; the agent answered "
        f"{attached.waited_ms:.0f} ms later at {attached.socket}\n"
    )


def write_hang(answer: Any, format: str) -> None:
    """`probing PID hang`: notes, then the verdict and each thread (or the report as JSON),
    then the stuck DataLoader worker's stacks."""
    notes(answer.notes)
    if format == "json":
        write_json(answer.report.to_json())
        return
    out = sys.stdout
    _write_verdict(answer.report, out)
    if answer.worker is not None:
        write_backtrace_text(answer.worker, out)


def _write_verdict(report: Any, out: IO[str]) -> None:
    # The verdict in one sentence, from analysis.progress: which thread decided it and why.
    verdict = f"{'hung' if report.hung else 'progressing'}: {inert(report.reason)}"
    out.write(f"PID {report.pid} is {verdict} in {report.duration_s:.1f} s ({report.samples} samples)\n\n")
    columns = ["thread", "activity", "cpu", "state", "where"]
    rows = [
        (
            f"{thread.name}{' (main)' if thread.is_main else ''}",
            thread.activity,
            "?" if thread.cpu_percent is None else f"{thread.cpu_percent:.0f}%",
            thread.state,
            thread.where,
        )
        for thread in report.threads
    ]
    write_table(columns, ["VARCHAR"] * len(columns), rows, out)
    worker = report.worker
    if worker is not None:
        index = f", index {worker['index']}" if worker.get("index") is not None else ""
        where = f"{worker['where']}{index}"
        out.write(f"\nThe DataLoader is waiting for worker PID {worker['pid']}, stuck in {inert(where)}:\n\n")


def write_eval_result(result: Dict[str, Any]) -> None:
    out, err = sys.stdout, sys.stderr
    if result.get("stdout"):
        out.write(inert_lines(result["stdout"], out))
    if result.get("stderr"):
        err.write(inert_lines(result["stderr"], err))
    if result.get("value") is not None:
        out.write(inert_lines(str(result["value"]), out) + "\n")


def write_detached(pid: Any) -> None:
    sys.stdout.write(f"PID {pid}: agent stopped (threads, hooks and socket removed); the job runs on\n")


def write_started(pid: int, command: List[str]) -> None:
    """`probing run`: the child's PID, on stderr (stdout is the job's)."""
    sys.stderr.write(f"probing: started PID {pid}: {' '.join(command)}\n")
    sys.stderr.flush()


def write_hung_job(job: Any, report_path: Optional[str]) -> None:
    """`probing run --hang-timeout`: the JSON report when asked for (first: a CI script's file
    outlives a reader of stderr that went away), then every stack of the hung job's process tree
    on stderr (each thread with the locals of its innermost frame)."""
    records = getattr(job, "records", ())
    unwritten = None
    if report_path:
        read = [{"pid": pid, "frames": stacks.rows} for pid, stacks, _ in job.processes if stacks is not None]
        document: Dict[str, Any] = {"hung": True, "stalled_s": round(job.stalled_s, 1), "processes": read}
        if job.job is not None:
            document["job"] = job.job.to_json()
        else:
            document["reason"] = job.reason
        document["records"] = [
            {"pid": outcome.pid, "path": outcome.path, "error": outcome.error} for outcome in records
        ]
        try:
            write_output(report_path, [dumps(document, 2), "\n"])
        except ProbingError as failed:  # the disk filled up meanwhile: the stacks still go to stderr
            unwritten = failed.message
    err = sys.stderr
    if unwritten is not None:
        err.write(f"probing: no report: {inert(unwritten)}\n")
    if job.job is not None:
        from .job import write_job_hang  # most commands load reports.py: only a job's needs it

        err.write(
            f"probing: a rank of the job made no progress for {job.stalled_s:.0f} s; the job's verdict, "
            "then every stack of its process tree, then it is ended\n"
        )
        write_job_hang(job.job, "text", err)
    else:
        # The verdict names the threads that decided it (analysis.progress), as `hang` does.
        verdict = job.reason or "no thread that carries it moved or used the CPU"
        err.write(
            f"probing: the job made no progress for {job.stalled_s:.0f} s ({inert(verdict)}); every stack "
            "of its process tree follows, then it is ended\n"
        )
    for pid, stacks, error in job.processes:
        if stacks is None:
            err.write(f"\nprobing: PID {pid}: {inert(error.message)}\n")
            continue
        write_stacks_to_stderr(stacks)
    for outcome in records:
        if outcome.path is not None:
            err.write(f"probing: PID {outcome.pid}: record written to {inert(outcome.path)}\n")
        else:
            err.write(f"probing: PID {outcome.pid}: no record ({inert(outcome.error or '')})\n")
    err.flush()


def switch_fields(result: Dict[str, Any]) -> Dict[str, Any]:
    """`trace` / `nan` --format json: the status with the PID and the hook counts."""
    return dict(result["status"], pid=result["pid"], hooks_before=result["hooks_before"],
                hooks_after=result["hooks_after"])  # fmt: skip


def _tracing_state(status: Dict[str, Any]) -> str:
    """`trace`'s state in a line: off, or on with how often, which passes and which modules."""
    if not status["trace"]:
        return "off"
    if status["every_auto"]:
        cost = status.get("call_cost_us")
        measured = f"; {cost} us per traced call here" if isinstance(cost, (int, float)) and cost > 0 else ""
        every = (
            f"{'every step' if status['every'] == 1 else 'one step in ' + str(status['every'])} "
            f"(chosen to keep tracing under 1% of the step time{measured})"
        )
    else:
        every = "every step" if status["every"] == 1 else f"one step in {status['every']}"
    narrowed = []
    if status["modules"]:
        narrowed.append("modules " + " ".join(status["modules"]))
    if status["depth"] is not None:
        narrowed.append(f"depth <= {status['depth']}")
    tracing = f"on, {every}, forward{' and backward' if status['backward'] else ' only'}"
    tracing += f" ({'; '.join(narrowed)})" if narrowed else ""
    return tracing


def _nan_state(status: Dict[str, Any]) -> str:
    """The NaN checks' state in a line, with the step they stopped the job at."""
    nan = "off"
    if status["nan"]:
        nan = "on" + (", --stop: raise at the first NaN/Inf" if status["stop_on_nan"] else "")
    if status["stopped_at_step"] is not None:
        nan += f" (stopped the job at step {status['stopped_at_step']})"
    return nan


def write_switch(
    feature: str, action: str, result: Dict[str, Any], format: str, out: Optional[IO[str]] = None
) -> None:
    """What `trace` and `nan` did, and where things stand now. `out` given (one rank of many):
    the text without the PID, which heads it there."""
    pid = result["pid"]
    if format == "json":
        write_json(switch_fields(result), indent=None)
        return
    who = "" if out is not None else f"PID {pid}: "
    out = out or sys.stdout
    status = result["status"]
    added = result["hooks_after"] - result["hooks_before"]
    models = ", ".join(status["models"]) or "none found yet"
    optimizers = ", ".join(status["optimizers"]) or "none seen yet"
    tracing = _tracing_state(status)
    nan = _nan_state(status)
    if action == "on":
        out.write(f"{who}{feature} on; {counted(added, 'hook')} added\n")
    elif action == "off":
        removed = -added
        kept = result["hooks_after"]
        out.write(f"{who}{feature} off; {counted(removed, 'hook')} removed")
        out.write(
            f", {counted(kept, 'hook')} kept for {'nan' if feature == 'trace' else 'trace'}\n"
            if kept
            else "\n"
        )
    elif who:
        out.write(f"PID {pid}:\n")
    out.write(f"  tracing:    {tracing}\n")
    out.write(f"  nan checks: {nan}\n")
    if feature == "nan" and status["nan"]:
        for line in nan_session_lines(status.get("nan_session")):
            out.write(line + "\n")
    out.write(
        f"  models:     {models} ({counted(status['hooked_modules'], 'module')} hooked, "
        f"{counted(status['hooks'], 'hook')} in all)\n"
    )
    out.write(f"  optimizers: {optimizers}\n")
    dropped = f" ({status['dropped_rows']} older rows dropped)" if status["dropped_rows"] else ""
    out.write(
        f"  step {status['step']}; python.torch_trace holds {status['rows']} of {status['capacity']} rows"
        f"{dropped}; python.nan_events {status['nan_events']}\n"
    )
    if status["error"]:
        out.write(f"  stopped after an error in a hook (nothing was raised in the job): {status['error']}\n")
    for message in status.get("notes") or ():  # what a bounded search for the models may have missed
        out.write(f"  note: {inert(str(message))}\n")
