"""The one-file HTML report of a job (`probing PID report -o job.html`): engine/report/live.py's
data in, a whole page out. Sections whose data is absent are left out; where a reader would
look for one, a line says why. Text the job controls goes through `text()`; the charts' data
through `data_script`, drawn by Chart.js (report_assets.py)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict

from ..render.memory import duration, size
from .page import data_script, document, library_script, text
from .report_assets import SCRIPT, STYLE
from .report_parts import LATEST_EPOCH, number, seconds, section, table, utc
from .report_threads import threads_section

if TYPE_CHECKING:
    from ...engine.report.live import Report


# Why a record was written, when that reason is itself a failure (a red banner, not an amber one).
# The chart of gc's objects needs this many counted points to show a course, not a dot or two.
MIN_GC_POINTS = 3
FAILURE_KINDS = {"exception", "fatal_signal", "nan", "watchdog", "collective_timeout"}


def _header(report: Report) -> str:
    process = report.process
    command = " ".join(process.get("argv") or []) or "(command line unknown)"
    what = "Record of PID" if report.record is not None else "PID"
    took = report.timings.get("total_s")
    gathered = f"; gathered in {seconds(took)}" if took is not None else ""
    return (
        f"<header><h1>{what} {text(process.get('pid') or '?')}</h1>"
        f'<div class="command">{text(command)}</div>'
        f'<div class="meta">probing report, {text(utc(report.generated_at))}{text(gathered)}</div></header>'
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
    parts.append(f"<p>{text(record.get('path'))}, written {text(utc(record.get('written_at')))}</p>")
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


def _partial_banner(report: Report) -> str:
    """A live report some part of which failed: the page is partial, and says so first."""
    if not report.failures:
        return ""
    pid = report.process.get("pid") or "?"
    title = (
        f"PID {pid} exited during the report: what follows was read before"
        if report.gone
        else "Part of this report could not be gathered"
    )
    items = "".join(f"<li>{text(failure)}</li>" for failure in report.failures)
    return f'<div class="banner bad" id="partial"><h2>{text(title)}</h2><ul>{items}</ul></div>'


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
    uptime = process.get("uptime_s")
    if isinstance(uptime, (int, float)) and math.isfinite(uptime) and 0 <= uptime < LATEST_EPOCH:
        facts.append(("Up for", f"{duration(process['uptime_s'])} (since {utc(process.get('started_at'))})"))
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
        why
        for key, why in report.absent.items()
        if key in ("torch", "steps", "tables", "object_types", "tensors")
    ]
    missing = "".join(f"<li>{text(why)}</li>" for why in left_out)
    return section("process", "Process", "", f'<dl class="facts">{rows}</dl>'
                    + (f'<ul class="left-out">{missing}</ul>' if missing else ""))  # fmt: skip


def _steps(report: Report) -> str:
    steps = report.steps
    if not steps:
        return ""
    # From one step's start to the next's; when only one step is there, its traced calls.
    paced = [step for step in steps if step.get("seconds") is not None]
    key = "seconds" if paced else "traced_s"
    times = sorted(step[key] for step in steps if step.get(key) is not None)
    if not times:
        return ""
    shown = paced or steps
    median = times[len(times) // 2]
    figures = (
        f'<div class="figures"><div>last <b>{text(seconds(shown[-1][key]))}</b></div>'
        f"<div>median <b>{text(seconds(median))}</b></div>"
        f"<div>slowest <b>{text(seconds(times[-1]))}</b></div>"
        f"<div>steps <b>{steps[0]['step']}–{steps[-1]['step']}</b></div></div>"
    )
    lead = (
        "Step time: from a step's start to the next traced step's start (per step when steps "
        "between were not traced), so data loading and other work between steps count. "
        "“In traced calls”: from its start to the end of its last traced call. "
        "Only steps traced from start to end count: the step under way is left out, and so are "
        "the time tracing was off (`trace off` … `trace on`) and the steps either cut."
    )
    if not paced:
        lead = "One traced step so far: the time in its traced calls (from its start to its last call's end)."
    if report.nan_events:
        lead += " Red triangles: steps where a NaN or Inf was seen (only the first, when there are many)."
    chart = '<div class="chart"><canvas id="chart-steps"></canvas></div>'
    return section("steps", "Step time", text(lead), figures + chart)


def _modules(report: Report) -> str:
    modules = report.modules
    if not modules:
        return ""
    window = modules[0].get("steps")
    rows = [
        [text(m["module"]), text(m.get("module_type") or ""), text(seconds(m["forward_s"])),
         text(seconds(m["backward_s"])) if m["backward_s"] else "",
         text(seconds(m["optimizer_s"])) if m["optimizer_s"] else "", text(seconds(m["total_s"])),
         text(f"{m['calls'] / (m.get('steps') or 1):.3g}")]
        for m in modules
    ]  # fmt: skip
    drawn = table(["module", "type", "forward", "backward", "optimizer", "per step", "calls/step"], rows,
                   [False, False, True, True, True, True, True])  # fmt: skip
    height = max(220, 26 * len(modules) + 70)
    chart = f'<div class="chart" style="height:{height}px"><canvas id="chart-modules"></canvas></div>'
    lead = (
        f"Mean time per step over the {window} traced steps among the last 20 (the step under way "
        "left out), forward and backward apart. A module's time includes its submodules'. "
        "Calls/step: its calls in one stage (forward or backward), per step."
    )
    return section("modules", "Slowest modules", text(lead), chart + drawn)


def _memory(report: Report) -> str:
    history = report.memory
    if not history:
        return ""
    charts = ['<div><div class="chart"><canvas id="chart-rss"></canvas></div></div>']
    if any(point.get("cuda_allocated_mb") is not None or point.get("cuda_reserved_mb") is not None
           for point in history):  # fmt: skip
        charts.append('<div><div class="chart"><canvas id="chart-cuda"></canvas></div></div>')
    counted = sum(1 for point in history if point.get("gc_objects") is not None)
    if counted >= MIN_GC_POINTS:
        charts.append('<div><div class="chart"><canvas id="chart-gc"></canvas></div></div>')
    rss = [point["rss_mb"] for point in history if point.get("rss_mb") is not None]
    span = history[-1]["ts"] - history[0]["ts"] if len(history) > 1 else 0.0
    figures = ""
    if rss:
        figures = (
            f'<div class="figures"><div>RSS at the end <b>{text(size(rss[-1]))}</b></div>'
            f"<div>peak <b>{text(size(max(rss)))}</b></div>"
            f"<div>at the start <b>{text(size(rss[0]))}</b></div>"
            f"<div>over <b>{text(duration(span))}</b></div></div>"
        )
    lead = (
        "process.memory, sampled by the agent. A long history is cut into at most 600 spans, "
        "each point (and the start and end figures) the peak of its span."
    )
    if counted < MIN_GC_POINTS:
        # A count of gc's objects holds the job's GIL (30 ms a million objects), so the sampler
        # counts rarely on a big heap, and not at all past its stall bound: one or two points
        # (the start-up's) drew an empty-looking chart.
        lead += text(
            f" The objects gc tracks were counted at {counted} of these {len(history)} points, too few "
            "for a chart: a count holds the job's GIL, so the agent counts them rarely on a large heap "
            "and not at all once a count would hold it too long."
        )
        if report.record is None:
            lead += text(f" `probing {report.process.get('pid') or 'PID'} memory` counts them now.")
    return section("memory", "Memory over time", lead, figures + f'<div class="grid">{"".join(charts)}</div>')


def _nan_events(report: Report) -> str:
    if not report.nan_events:
        return ""
    rows = [
        [number(e.get("step")), text(e.get("module") or ""), text(e.get("stage") or ""),
         text(e.get("tensor") or ""), number(e.get("nan_count")), number(e.get("inf_count")),
         {True: "yes: it arose here", False: "no", None: "?"}[e.get("input_finite")],
         text(_weights(e))]
        for e in report.nan_events
    ]  # fmt: skip
    drawn = table(["step", "module", "stage", "tensor", "NaN", "Inf", "input finite", "its weights"], rows,
                   [True, False, False, False, True, True, False, False])  # fmt: skip
    lead = "The first module of each step whose output or gradient held NaN or Inf"
    shown = len(report.nan_events)
    if report.nan_event_count > shown:
        lead += f": the first {shown} of {report.nan_event_count:,} events"
    return section("nan", "NaN and Inf", text(lead + "."), drawn)


def _weights(event: Dict[str, Any]) -> str:
    """python.nan_events' weights columns in words: where NaN arose in a module, whether its own
    weights held it, and whether they already did when the checks began (the cause is earlier)."""
    if event.get("weights_finite") is True:
        return "finite"
    if event.get("weights_finite") is False:
        if event.get("weights_already_nonfinite") is True:
            return "NaN/Inf already when checks began (the cause is earlier)"
        return "NaN/Inf"
    return ""


def _object_types(report: Report) -> str:
    if not report.object_types:
        return ""
    rows = [
        [text(entry.get("type")), number(entry.get("count")), text(size(entry.get("size_mb"))),
         "" if entry.get("cuda_mb") is None else text(size(entry["cuda_mb"]))]
        for entry in report.object_types
    ]  # fmt: skip
    lead = (
        "Live objects the garbage collector tracks, by type, largest first "
        "(as `probing PID memory` lists them)."
    )
    return section("objects", "Largest object types", lead,
                    table(["type", "count", "size", "CUDA"], rows, [False, True, True, True]))  # fmt: skip


def _tensors(report: Report) -> str:
    if not report.tensors:
        return ""
    rows = [
        [text(t.get("name") or "(holder not found)"), text(t.get("kind") or ""), text(t.get("shape") or ""),
         text(t.get("dtype") or ""), text(t.get("device") or ""),
         text(size(t["bytes"] / 1048576.0)) if isinstance(t.get("bytes"), int) else "",
         text(t.get("grad_fn") or "")]
        for t in report.tensors
    ]  # fmt: skip
    drawn = table(["name", "kind", "shape", "dtype", "device", "size", "grad_fn"], rows,
                   [False, False, False, False, False, True, False])  # fmt: skip
    return section(
        "tensors",
        "Largest tensors",
        "python.tensors: parameters, gradients and buffers by name; other live tensors by what holds "
        "them (such as __main__.history[17]), as far as a time-bounded walk from the job's variables "
        "finds it.",
        drawn,
    )


def _footer(report: Report) -> str:
    shown = report.absent.get("agent", "")  # its note is in the banner at the top already
    items = [text(note) for note in report.notes if note not in shown]
    if "hang" in report.absent and report.record is None and report.absent["hang"] not in report.failures:
        items.append(text(report.absent["hang"]))
    timings = ", ".join(
        f"{name.replace('_s', '')} {seconds(value)}" for name, value in report.timings.items()
    )
    items.append(text(f"time taken: {timings}"))
    return f"<footer><ul>{''.join(f'<li>{item}</li>' for item in items)}</ul></footer>"


def chart_data(report: Report) -> Dict[str, Any]:
    """What the page's script draws: numbers, and module names it paints on a canvas."""
    return {
        "steps": [
            {"step": s["step"], "seconds": s.get("seconds"), "traced_s": s.get("traced_s")}
            for s in report.steps
        ],  # fmt: skip
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
    sections = [_partial_banner(report), _record_banner(report), _agent_banner(report), _hang_banner(report),
                _process(report),
                _steps(report), _modules(report), _memory(report), _nan_events(report),
                threads_section(report),
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
