"""The one-file HTML report of a job (`probing PID report -o job.html`): engine/report.py's
data in, a whole page out. Sections whose data is absent are left out; where a reader would
look for one, a line says why. Text the job controls goes through `text()`; the charts' data
through `data_script`, drawn by Chart.js (report_assets.py)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence

from ..render.memory import duration, size
from .page import data_script, document, library_script, text
from .report_assets import SCRIPT, STYLE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...engine.report import Report


# Why a record was written, when that reason is itself a failure (a red banner, not an amber one).
FAILURE_KINDS = {"exception", "fatal_signal", "nan", "watchdog", "collective_timeout"}


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "?"
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.1f} ms"


def _utc(epoch: Optional[float]) -> str:
    if epoch is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def _number(value: Any) -> str:
    return "" if value is None else f"{value:,}" if isinstance(value, int) else text(value)


def _table(header: Sequence[str], rows: List[List[str]], numeric: Sequence[bool]) -> str:
    """A table of cells already made HTML (text() or formatted numbers)."""
    head = "".join(f'<th class="num">{text(h)}</th>' if n else f"<th>{text(h)}</th>"
                   for h, n in zip(header, numeric))  # fmt: skip
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{cell}</td>' if n else f'<td class="name">{cell}</td>'
            for cell, n in zip(row, numeric)
        )
        + "</tr>"  # fmt: skip
        for row in rows
    )
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _section(element_id: str, title: str, lead: str, content: str) -> str:
    lead_html = f'<p class="lead">{lead}</p>' if lead else ""
    return f'<section id="{element_id}"><h2>{text(title)}</h2>{lead_html}{content}</section>'


def _header(report: Report) -> str:
    process = report.process
    command = " ".join(process.get("argv") or []) or "(command line unknown)"
    what = "Record of PID" if report.record is not None else "PID"
    took = report.timings.get("total_s")
    gathered = f"; gathered in {_seconds(took)}" if took is not None else ""
    return (
        f"<header><h1>{what} {text(process.get('pid') or '?')}</h1>"
        f'<div class="command">{text(command)}</div>'
        f'<div class="meta">probing report, {text(_utc(report.generated_at))}{text(gathered)}</div></header>'
    )


def _record_banner(report: Report) -> str:
    record = report.record
    if record is None:
        return ""
    reason = record.get("reason") or {}
    why = (reason.get("kind") or "unknown").replace("_", " ")
    message = reason.get("message") or ""
    parts = [f"<h2>Written because: {text(why)}</h2>"]
    exception = record.get("exception")
    if message and not exception:  # an exception's own line says the same, and more
        parts.append(f"<p>{text(message)}</p>")
    parts.append(f"<p>{text(record.get('path'))}, written {text(_utc(record.get('written_at')))}</p>")
    if exception:
        title = f"{exception.get('type') or 'exception'}: {exception.get('message') or ''}"
        thread = f" (in thread {exception['thread']})" if exception.get("thread") else ""
        parts.append(f"<p><b>{text(title)}</b>{text(thread)}</p>")
        if exception.get("text"):
            parts.append(f"<pre>{text(exception['text'])}</pre>")
    if record.get("verdict"):
        parts.append(f"<p>{text(record['verdict'])}</p>")
    bad = exception or record.get("stuck") or reason.get("kind") in FAILURE_KINDS
    kind = "bad" if bad else "warn"
    return f'<div class="banner {kind}" id="record">{"".join(parts)}</div>'


def _agent_banner(report: Report) -> str:
    why = report.absent.get("agent")
    if why is None:
        return ""
    return (
        '<div class="banner warn" id="outside"><h2>The stacks were read from outside the process '
        f"(py-spy)</h2><p>{text(why)}.</p></div>"
    )


def _hang_banner(report: Report) -> str:
    hang = report.hang
    if hang is None:
        return ""
    kind, title = ("bad", "Hung") if hang["hung"] else ("good", "Progressing")
    watched = (
        f"{hang['samples']} stack samples over {hang['duration_s']:.1f} s "
        f"(the check took {hang['took_s']:.1f} s, as `probing PID hang` judges)"
    )
    worker = hang.get("worker")
    worker_line = ""
    if worker:
        worker_line = f"<p>DataLoader worker PID {text(worker.get('pid'))} holds the batch.</p>"
    return (
        f'<div class="banner {kind}" id="hang"><h2>{title}</h2><p>{text(hang["reason"])}</p>'
        f"{worker_line}<p>{text(watched)}</p></div>"
    )


def _process(report: Report) -> str:
    process = report.process
    facts = [("PID", process.get("pid")), ("Command", " ".join(process.get("argv") or []) or None),
             ("Python", process.get("python_version"))]  # fmt: skip
    if process.get("torch_version"):
        facts.append(("torch", process["torch_version"]))
    elif report.has_torch:
        facts.append(("torch", "imported (version not known)"))
    if process.get("uptime_s") is not None:
        facts.append(("Up for", f"{duration(process['uptime_s'])} (since {_utc(process.get('started_at'))})"))
    if process.get("rank") is not None:
        facts.append(("Rank", f"{process['rank']} of {process.get('world_size') or '?'}"
                              f" (local rank {process.get('local_rank')})"))  # fmt: skip
        facts.append(("Node", process.get("node")))
    facts += [("Executable", process.get("executable")), ("Working directory", process.get("cwd")),
              ("probing", process.get("probing_version"))]  # fmt: skip
    rows = "".join(
        f"<dt>{text(name)}</dt><dd>{text(value)}</dd>" for name, value in facts if value is not None
    )
    left_out = [
        why for key, why in report.absent.items() if key in ("torch", "steps", "tables", "object_types")
    ]
    missing = "".join(f"<li>{text(why)}</li>" for why in left_out)
    return _section("process", "Process", "", f'<dl class="facts">{rows}</dl>'
                    + (f'<ul class="left-out">{missing}</ul>' if missing else ""))  # fmt: skip


def _steps(report: Report) -> str:
    steps = report.steps
    if not steps:
        return ""
    times = sorted(step["seconds"] for step in steps if step["seconds"] is not None)
    if not times:
        return ""
    median = times[len(times) // 2]
    figures = (
        f'<div class="figures"><div>last <b>{text(_seconds(steps[-1]["seconds"]))}</b></div>'
        f"<div>median <b>{text(_seconds(median))}</b></div>"
        f"<div>slowest <b>{text(_seconds(times[-1]))}</b></div>"
        f"<div>steps <b>{steps[0]['step']}–{steps[-1]['step']}</b></div></div>"
    )
    lead = "How long each traced step took (its last call's end), the step under way left out."
    if report.nan_events:
        lead += " Red triangles: steps where a NaN or Inf was seen (only the first, when there are many)."
    return _section(
        "steps", "Step time", lead, figures + '<div class="chart"><canvas id="chart-steps"></canvas></div>'
    )


def _modules(report: Report) -> str:
    modules = report.modules
    if not modules:
        return ""
    window = modules[0].get("steps")
    rows = [
        [text(m["module"]), text(m.get("module_type") or ""), text(_seconds(m["forward_s"])),
         text(_seconds(m["backward_s"])) if m["backward_s"] else "",
         text(_seconds(m["optimizer_s"])) if m["optimizer_s"] else "", text(_seconds(m["total_s"])),
         _number(m["calls"])]
        for m in modules
    ]  # fmt: skip
    table = _table(["module", "type", "forward", "backward", "optimizer", "per step", "calls"], rows,
                   [False, False, True, True, True, True, True])  # fmt: skip
    height = max(220, 26 * len(modules) + 70)
    chart = f'<div class="chart" style="height:{height}px"><canvas id="chart-modules"></canvas></div>'
    lead = (
        f"Mean time per step over the last {window} whole steps, forward and backward apart. "
        "A module's time includes its submodules'."
    )
    return _section("modules", "Slowest modules", text(lead), chart + table)


def _memory(report: Report) -> str:
    history = report.memory
    if not history:
        return ""
    charts = ['<div><div class="chart"><canvas id="chart-rss"></canvas></div></div>']
    if any(point.get("cuda_allocated_mb") is not None or point.get("cuda_reserved_mb") is not None
           for point in history):  # fmt: skip
        charts.append('<div><div class="chart"><canvas id="chart-cuda"></canvas></div></div>')
    if any(point.get("gc_objects") is not None for point in history):
        charts.append('<div><div class="chart"><canvas id="chart-gc"></canvas></div></div>')
    rss = [point["rss_mb"] for point in history if point.get("rss_mb") is not None]
    span = history[-1]["ts"] - history[0]["ts"] if len(history) > 1 else 0.0
    figures = ""
    if rss:
        figures = (
            f'<div class="figures"><div>RSS now <b>{text(size(rss[-1]))}</b></div>'
            f"<div>peak <b>{text(size(max(rss)))}</b></div>"
            f"<div>first <b>{text(size(rss[0]))}</b></div>"
            f"<div>over <b>{text(duration(span))}</b></div></div>"
        )
    lead = "process.memory, sampled by the agent (each point the peak of its span)."
    return _section(
        "memory", "Memory over time", lead, figures + f'<div class="grid">{"".join(charts)}</div>'
    )


def _nan_events(report: Report) -> str:
    if not report.nan_events:
        return ""
    rows = [
        [_number(e.get("step")), text(e.get("module") or ""), text(e.get("stage") or ""),
         text(e.get("tensor") or ""), _number(e.get("nan_count")), _number(e.get("inf_count")),
         {True: "yes: this module made it", False: "no", None: "?"}[e.get("input_finite")]]
        for e in report.nan_events
    ]  # fmt: skip
    table = _table(["step", "module", "stage", "tensor", "NaN", "Inf", "input finite"], rows,
                   [True, False, False, False, True, True, False])  # fmt: skip
    lead = "The first module of each step whose output or gradient held NaN or Inf"
    shown = len(report.nan_events)
    if report.nan_event_count > shown:
        lead += f": the first {shown} of {report.nan_event_count:,} events"
    return _section("nan", "NaN and Inf", text(lead + "."), table)


def _state_pill(state: str) -> str:
    kind = "bad" if "GIL" in state or "died" in state else "quiet" if "wait" in state else ""
    return f'<span class="pill {kind}">{text(state)}</span>'


def _thread(thread: Dict[str, Any]) -> str:
    frames = []
    for frame in reversed(thread["frames"]):  # most recent call last, as a traceback reads
        native = frame.get("frame_type") == "Native"
        code = f'<span class="code">{text(frame["code"])}</span>' if frame.get("code") else ""
        frames.append(
            f'<li class="{"native" if native else "python"}">'
            f'<span class="func">{text(frame.get("func"))}</span>'
            f' <span class="file">{text(frame.get("file"))}:{text(frame.get("lineno"))}</span>{code}</li>'
        )
    extra = []
    if thread.get("activity"):
        kind = "good" if thread["activity"] in ("moved", "busy") else "quiet"
        extra.append(
            f'<span class="pill {kind}" title="over the hang check">{text(thread["activity"])}</span>'
        )
    if thread.get("is_main"):
        extra.append('<span class="pill">main</span>')
    if thread.get("daemon"):
        extra.append('<span class="pill quiet">daemon</span>')
    if thread.get("cpu_s") is not None:
        extra.append(f'<span class="where">CPU {text(_seconds(thread["cpu_s"]))}</span>')
    # The main thread, and a thread holding the GIL (it stops every other): their stacks matter first.
    opened = " open" if thread.get("is_main") or "GIL" in str(thread.get("state")) else ""
    ids = f"thread {thread.get('thread_id')}, native {thread.get('native_id')}"
    return (
        f'<details class="thread"{opened}><summary><span class="tname">{text(thread.get("name"))}</span>'
        f"{_state_pill(thread.get('state') or '')}{''.join(extra)}"
        f'<span class="where">{text(thread.get("where"))} · {text(ids)}</span></summary>'
        f'<ol class="frames">{"".join(frames)}</ol></details>'
    )


def _threads(report: Report) -> str:
    if not report.threads:
        return ""
    source = {"agent": "read by the agent", "py-spy": "read from outside the process (py-spy)",
              "record": "as the record holds them"}[report.stacks_source]  # fmt: skip
    lead = f"{len(report.threads)} threads, {source}; the main thread first. Most recent call last."
    return _section("threads", "Threads", text(lead), "".join(_thread(thread) for thread in report.threads))


def _object_types(report: Report) -> str:
    if not report.object_types:
        return ""
    rows = [
        [text(entry.get("type")), _number(entry.get("count")), text(size(entry.get("size_mb"))),
         "" if entry.get("cuda_mb") is None else text(size(entry["cuda_mb"]))]
        for entry in report.object_types
    ]  # fmt: skip
    lead = (
        "Live objects the garbage collector tracks, by type, largest first "
        "(as `probing PID memory` lists them)."
    )
    return _section("objects", "Largest object types", lead,
                    _table(["type", "count", "size", "CUDA"], rows, [False, True, True, True]))  # fmt: skip


def _tensors(report: Report) -> str:
    if not report.tensors:
        return ""
    rows = [
        [text(t.get("name") or "(unnamed)"), text(t.get("kind") or ""), text(t.get("shape") or ""),
         text(t.get("dtype") or ""), text(t.get("device") or ""),
         text(size(t["bytes"] / 1048576.0)) if isinstance(t.get("bytes"), int) else "",
         text(t.get("grad_fn") or "")]
        for t in report.tensors
    ]  # fmt: skip
    table = _table(["name", "kind", "shape", "dtype", "device", "size", "grad_fn"], rows,
                   [False, False, False, False, False, True, False])  # fmt: skip
    return _section(
        "tensors",
        "Largest tensors",
        "python.tensors: parameters, gradients, buffers and other live tensors.",
        table,
    )


def _footer(report: Report) -> str:
    shown = report.absent.get("agent", "")  # its note is in the banner at the top already
    items = [text(note) for note in report.notes if note not in shown]
    if "hang" in report.absent and report.record is None:
        items.append(text(report.absent["hang"]))
    timings = ", ".join(
        f"{name.replace('_s', '')} {_seconds(value)}" for name, value in report.timings.items()
    )
    items.append(text(f"time taken: {timings}"))
    return f"<footer><ul>{''.join(f'<li>{item}</li>' for item in items)}</ul></footer>"


def chart_data(report: Report) -> Dict[str, Any]:
    """What the page's script draws: numbers, and module names it paints on a canvas."""
    return {
        "steps": [{"step": s["step"], "seconds": s["seconds"]} for s in report.steps],
        "nan_steps": report.nan_steps,
        "modules": [
            {key: m[key] for key in ("module", "forward_s", "backward_s", "optimizer_s")}
            for m in report.modules
        ],  # fmt: skip
        "memory": [
            {
                key: point.get(key)
                for key in ("ts", "rss_mb", "cuda_allocated_mb", "cuda_reserved_mb", "gc_objects")
            }
            for point in report.memory
        ],  # fmt: skip
    }


def report_page(report: Report) -> str:
    """The whole page."""
    sections = [_record_banner(report), _agent_banner(report), _hang_banner(report), _process(report),
                _steps(report), _modules(report), _memory(report), _nan_events(report), _threads(report),
                _object_types(report), _tensors(report), _footer(report)]  # fmt: skip
    charts = bool(report.steps or report.modules or report.memory)
    body = (
        f"<main>{_header(report)}{''.join(sections)}</main>\n"
        + data_script("report-data", chart_data(report))
        + (library_script("chart") + f"<script>{SCRIPT}</script>" if charts else "")
    )
    process = report.process
    title = f"probing report: PID {process.get('pid') or '?'}"
    return document(title, f"<style>{STYLE}</style>", body)
