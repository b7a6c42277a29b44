"""The one-file HTML page of a whole job (`probing PID report --ranks all -o job.html`):
engine/report/job.py's data in, a whole page out, with the single report's style sheet, parts
and thread entries. Sections that do not apply are left out. Text the job controls goes through
`text()`; the charts' data (a line per rank) through `data_script`, drawn by Chart.js."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Dict, List

from ..render.job import collective_text, compact_text, gil_text, group_text, pid_text, reached_text
from ..render.memory import size
from ..render.per_rank import heading, rank_ranges
from .page import data_script, document, library_script, text
from .report_assets import CHART_PRELUDE, STYLE
from .report_parts import number, seconds, section, table, utc
from .report_threads import thread_html

if TYPE_CHECKING:
    from ...engine.report.job import JobReport

JOB_STYLE = """
.on-ranks { margin: 10px 0 2px; font-weight: 600; font-size: 13px; unicode-bidi: isolate; }
"""

# A line per rank, its colour by its place among the ranks drawn (a straggler stands out by its
# height, not its colour: 64 colours are not told apart). Strings reach Chart.js as JSON only.
JOB_SCRIPT = (
    """
(() => {
  const data = JSON.parse(document.getElementById('job-data').textContent);
"""
    + CHART_PRELUDE
    + """
  const ranks = [...new Set(data.steps.map(s => s.rank).concat(data.memory.map(m => m.rank)))]
    .sort((a, b) => a - b);
  const colour = rank => 'hsl(' + Math.round(360 * ranks.indexOf(rank) / Math.max(ranks.length, 1))
    + ', 65%, 45%)';
  const perRank = (rows, point) => ranks.map(rank => ({
    label: 'rank ' + rank, borderColor: colour(rank), backgroundColor: colour(rank), borderWidth: 1.4,
    tension: 0, spanGaps: true, data: rows.filter(r => r.rank === rank).map(point).filter(p => p.y !== null),
  })).filter(set => set.data.length > 0)
    .map(set => Object.assign(set, {pointRadius: set.data.length > 40 ? 0 : 2}));
  const legend = sets => ({display: sets.length <= 16});

  if (canvas('chart-rank-steps')) {
    // Per rank as the single report: start to next start where a rank has it, else its one step's calls.
    const paced = new Set(data.steps.filter(s => s.seconds !== null).map(s => s.rank));
    const sets = perRank(data.steps, s => ({x: s.step, y: paced.has(s.rank) ? s.seconds : s.traced_s}));
    new Chart(canvas('chart-rank-steps'), {
      type: 'line', data: {datasets: sets},
      options: {scales: {x: {type: 'linear', title: {display: true, text: 'step'}, ticks: {precision: 0}},
                         y: {beginAtZero: true, title: {display: true, text: 'seconds'},
                             ticks: {callback: v => seconds(v)}}},
                plugins: {legend: legend(sets),
                          tooltip: {callbacks: {label: c => c.dataset.label + ': ' + seconds(c.parsed.y)}}}},
    });
  }
  const last = data.memory.reduce((m, p) => Math.max(m, p.ts), -Infinity);
  const first = data.memory.reduce((m, p) => Math.min(m, p.ts), Infinity) - last;
  const memory = (id, key, title) => {
    if (!canvas(id)) return;
    const sets = perRank(data.memory, m => ({x: m.ts - last, y: m[key]}));
    new Chart(canvas(id), {
      type: 'line', data: {datasets: sets},
      options: {scales: {x: {type: 'linear', min: Math.min(first, -1), max: 0,
                             ticks: {callback: v => ago(v), maxTicksLimit: 8},
                             title: {display: true, text: 'before the last sample'}},
                         y: {beginAtZero: true, title: {display: true, text: title},
                             ticks: {callback: v => mb(v)}}},
                interaction: {mode: 'nearest', axis: 'x', intersect: false},
                plugins: {legend: legend(sets),
                          tooltip: {callbacks: {title: items => ago(items[0].parsed.x),
                                    label: c => c.dataset.label + ': ' + mb(c.parsed.y)}}}},
    });
  };
  memory('chart-rank-rss', 'rss_mb', 'resident memory');
  memory('chart-rank-cuda', 'cuda_allocated_mb', 'CUDA allocated');
})();
"""
)


def _header(report: JobReport) -> str:
    job = report.job
    shown = [row["rank"] for row in report.ranks]
    took = report.timings.get("total_s")
    gathered = f"; gathered in {seconds(took)}" if took is not None else ""
    asked = len(job["asked"])
    what = (
        f"world size {job['world_size']}; {'rank' if len(shown) == 1 else 'ranks'} {rank_ranges(shown)} shown"
    )
    what += f" ({asked} {'rank' if asked == 1 else 'ranks'} asked)"
    return (
        f"<header><h1>Job: {text(job['name'])}</h1>"
        f'<div class="command">{text(what)}</div>'
        f'<div class="meta">probing report --ranks, {text(utc(report.generated_at))}{text(gathered)}</div>'
        "</header>"
    )


def _missing_banner(report: JobReport) -> str:
    """Ranks that gave no answer, first: what follows is the others. A rank that gave its stacks
    and then failed a later part (its tables, the hang watch) is on the page, with that said."""
    if not report.missing:
        return ""
    shown = {row["rank"] for row in report.ranks}
    silent = sum(1 for each in report.missing if each.rank.rank not in shown)
    partial = len(report.missing) - silent
    parts = []
    if silent:
        parts.append(
            f"{silent} {'rank' if silent == 1 else 'ranks'} gave no answer: the page shows the others"
        )
    if partial:
        parts.append(
            f"{partial} {'rank' if partial == 1 else 'ranks'} answered in part: what is missing is below"
        )
    title = "; ".join(parts)
    items = "".join(
        f"<li>{text(heading([each.rank]))}: {text(each.error.message)}</li>" for each in report.missing
    )
    return f'<div class="banner bad" id="missing"><h2>{text(title)}</h2><ul>{items}</ul></div>'


def _outside_banner(report: JobReport) -> str:
    why = report.absent.get("outside")
    if why is None:
        return ""
    return f'<div class="banner warn" id="outside"><h2>Stacks read from outside</h2><p>{text(why)}.</p></div>'


def _hang_banner(report: JobReport) -> str:
    verdict = report.verdict
    if verdict is None:
        return ""
    kind, title = ("bad", "The job is hung") if verdict.hung else ("good", "The job is progressing")
    watched = sum(1 for view in verdict.ranks if view.report is not None)
    line = f"{watched} {'rank' if watched == 1 else 'ranks'} watched for {verdict.duration_s:.1f} s"
    return (
        f'<div class="banner {kind}" id="hang"><h2>{text(title)}</h2><p>{text(verdict.reason)}</p>'
        f"<p>{text(line + ', as `probing PID hang --ranks all` judges.')}</p></div>"
    )


def _verdict(report: JobReport) -> str:
    """Behind and waiting ranks, mismatched collectives: the tables `hang --ranks` prints."""
    verdict = report.verdict
    if verdict is None or not (verdict.behind or verdict.waiting or verdict.mismatches):
        return ""
    parts = []
    if verdict.behind:
        rows = [[number(rank.rank), text(pid_text(rank)), text(rank.where), text(gil_text(rank)),
                 text(rank.activity), text(reached_text(rank))] for rank in verdict.behind]  # fmt: skip
        parts.append('<h3 id="behind">Behind (not at the collective the others wait in)</h3>'
                     + table(["rank", "pid", "where", "state", "activity", "last collective"], rows,
                             [True, True, False, False, False, False]))  # fmt: skip
    if verdict.waiting:
        rows = [[text(rank_ranges(waiting.ranks)), text(collective_text(waiting)),
                 text("?" if waiting.waited_s is None else f"{waiting.waited_s:.1f} s")]
                for waiting in verdict.waiting]  # fmt: skip
        parts.append(
            '<h3 id="waiting">Waiting</h3>' + table(["ranks", "in", "for"], rows, [False, False, True])
        )
    if verdict.mismatches:
        rows = [[text(group_text(mismatch.pg_id, mismatch.pg_desc)), number(mismatch.seq),
                 text(mismatch.kind), text(rank_ranges(call.ranks)), text(call.op),
                 text(compact_text(call.input_sizes)), text(compact_text(call.input_dtypes))]
                for mismatch in verdict.mismatches for call in mismatch.calls]  # fmt: skip
        parts.append(
            '<h3 id="mismatches">Mismatched collectives (the same sequence number, not the same call)</h3>'
            + table(
                ["process group", "seq", "differs in", "ranks", "op", "sizes", "dtypes"],
                rows,
                [False, True, False, False, False, False, False],
            )  # fmt: skip
            + f'<p class="lead">{text(verdict.mismatch_check[:1].upper() + verdict.mismatch_check[1:])}</p>'
        )
    lead = (
        f"Judged from {'the ranks’ Flight Recorders' if verdict.basis == 'collectives' else 'their stacks'}."
    )
    return section("verdict", "Hang verdict", text(lead), "".join(parts))


def _stragglers(report: JobReport) -> str:
    """Who the job waits for: the stragglers, each a row; the other ranks in one line."""
    verdict = report.stragglers
    if verdict is None or verdict.step_s is None:
        return ""
    from ..render.stragglers import no_straggler_line, straggler_line, verdict_line

    named = {each.rank for each in verdict.stragglers}
    where = "`probing PID stragglers` says where its time goes"
    lines = [straggler_line(each, verdict.op, where) for each in verdict.stragglers]
    if not lines:
        said = verdict_line(verdict) if verdict.stuck is not None else no_straggler_line(verdict)
        lines = [f"{said[0].upper()}{said[1:]}."]
    rows = [[number(t.rank), text(seconds(t.step_s)), text(seconds(t.computing_s)),
             text(seconds(t.waiting_s)), text(f"{t.last_share:.0%}"), text(seconds(t.delay_s)),
             text(f"{t.late_share:.0%}")]
            for t in verdict.ranks if t.rank in named]  # fmt: skip
    others = [t for t in verdict.ranks if t.rank not in named]
    if others and named:
        worst = max(t.delay_s for t in others)
        who = "The other rank" if len(others) == 1 else f"The other {len(others)} ranks"
        lines.append(f"{who}: late by {seconds(worst)} at most (median lateness).")
    lead = (
        f"Each rank's arrivals at the last {verdict.compared} {verdict.op}s every rank reached (of the"
        f" last minute, from its Flight Recorder), a step every {seconds(verdict.step_s)}."
    )
    drawn = "".join(f"<p>{text(line)}</p>" for line in lines)
    if rows:
        header = ["rank", "step", "computing", "waiting", "last to arrive", "late by", "late to"]
        drawn += table(header, rows, [True] * len(header))
    return section("stragglers", "Stragglers", text(lead), drawn)


def _ranks(report: JobReport) -> str:
    if not report.ranks:
        return ""
    rows = []
    for row in report.ranks:
        collective = ""
        if row.get("last_enqueued") is not None or row.get("last_completed") is not None:
            group = f" ({row['pg_desc']})" if row.get("pg_desc") else ""
            enqueued, completed = (row.get(key) for key in ("last_enqueued", "last_completed"))
            collective = (
                f"#{'?' if enqueued is None else enqueued} / #{'?' if completed is None else completed}"
            )
            collective += group
        state = row.get("state") or ""
        if row.get("activity"):
            state += f" ({row['activity']})"
        if row.get("source") == "py-spy":
            state += " [read from outside]"
        rss = row.get("rss_mb")
        pid = pid_text(SimpleNamespace(pid=row.get("pid"), host=row.get("host")))
        rows.append([number(row["rank"]), number(row.get("local_rank")), number(row.get("node")),
                     text(pid), text(row.get("where") or ""), text(state),
                     text(collective),
                     number(row.get("steps_traced")),
                     "" if row.get("last_step_s") is None else text(seconds(row["last_step_s"])),
                     "" if rss is None else text(size(rss))])  # fmt: skip
    header = ["rank", "local", "node", "pid", "main thread", "state", "collective enqueued / completed",
              "steps traced", "last step", "RSS"]  # fmt: skip
    lead = (
        "Each rank's main thread (as the hang check saw it, when it ran), its last collective enqueued "
        "and completed (python.process_groups), its traced steps, last step time and resident memory."
    )
    left_out = "".join(
        f"<li>{text(report.absent[key])}</li>" for key in ("steps", "tables") if key in report.absent
    )
    numeric = [True, True, True, True, False, False, False, True, True, True]
    # A figure no rank has (no torch.distributed, nothing traced) is a column left out.
    kept = [index for index in range(len(header)) if index < 6 or any(row[index] for row in rows)]
    drawn = table(
        [header[i] for i in kept], [[row[i] for i in kept] for row in rows], [numeric[i] for i in kept]
    )
    return section(
        "ranks", "Ranks", text(lead), drawn + (f'<ul class="left-out">{left_out}</ul>' if left_out else "")
    )


def _steps(report: JobReport) -> str:
    if not report.steps:
        return ""
    lead = (
        "A line per rank: from a step's start to the next traced step's start (the step under way "
        f"left out), each rank's last {max(1, _steps_per_rank(report))} steps at most. A rank whose "
        "line runs above the others is the straggler."
    )
    return section("steps", "Step time per rank", text(lead),
                   '<div class="chart tall"><canvas id="chart-rank-steps"></canvas></div>')  # fmt: skip


def _steps_per_rank(report: JobReport) -> int:
    counts: Dict[int, int] = {}
    for step in report.steps:
        counts[step["rank"]] = counts.get(step["rank"], 0) + 1
    return max(counts.values(), default=0)


def _memory(report: JobReport) -> str:
    if not report.memory:
        return ""
    charts = ['<div><div class="chart"><canvas id="chart-rank-rss"></canvas></div></div>']
    if any(point.get("cuda_allocated_mb") is not None for point in report.memory):
        charts.append('<div><div class="chart"><canvas id="chart-rank-cuda"></canvas></div></div>')
    lead = (
        "process.memory of each rank, a line per rank: resident memory, and CUDA memory allocated "
        "where the rank has it. Each point is the peak of its span."
    )
    return section("memory", "Memory per rank", text(lead), f'<div class="grid">{"".join(charts)}</div>')


def _threads(report: JobReport) -> str:
    if not report.threads:
        return ""
    entries = []
    for entry in report.threads:
        entries.append(f'<div class="on-ranks">{text(heading(entry["on"]))}</div>{thread_html(entry)}')
    lead = (
        f"{report.thread_count:,} threads of {len(report.ranks)} ranks; a thread with the same stack and "
        "state on several ranks is drawn once, headed by them. Main threads first; most recent call last."
    )
    tail = ""
    if report.threads_left_out:
        tail = (
            f'<p class="left-out">{report.threads_left_out:,} more threads are not drawn: the page holds '
            f"at most {len(report.threads)} stacks (`probing PID backtrace --ranks all` lists them all).</p>"
        )
    return section("threads", "Threads", text(lead), "".join(entries) + tail)


def _footer(report: JobReport) -> str:
    items = [text(note) for note in report.notes]
    items += [text(why) for key, why in report.absent.items() if key not in ("outside", "steps", "tables")]
    timings = ", ".join(
        f"{name.replace('_s', '')} {seconds(value)}" for name, value in report.timings.items()
    )
    items.append(text(f"time taken: {timings}"))
    return f"<footer><ul>{''.join(f'<li>{item}</li>' for item in items)}</ul></footer>"


def job_chart_data(report: JobReport) -> Dict[str, List[Dict[str, Any]]]:
    """What the page's script draws: numbers only, by rank."""
    return {
        "steps": [
            {key: step.get(key) for key in ("rank", "step", "seconds", "traced_s")} for step in report.steps
        ],
        "memory": [
            {key: point.get(key) for key in ("rank", "ts", "rss_mb", "cuda_allocated_mb")}
            for point in report.memory
        ],
    }


def job_report_page(report: JobReport) -> str:
    """The whole page."""
    sections = [_missing_banner(report), _outside_banner(report), _hang_banner(report),
                _verdict(report), _stragglers(report), _ranks(report), _steps(report), _memory(report),
                _threads(report), _footer(report)]  # fmt: skip
    charts = bool(report.steps or report.memory)
    body = (
        f"<main>{_header(report)}{''.join(sections)}</main>\n"
        + data_script("job-data", job_chart_data(report))
        + (library_script("chart") + f"<script>{JOB_SCRIPT}</script>" if charts else "")
    )
    return document(f"probing report: {report.job['name']}", f"<style>{STYLE}{JOB_STYLE}</style>", body)
