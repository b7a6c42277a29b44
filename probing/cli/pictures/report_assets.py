"""The report page's style sheet and its one script. The script reads the charts' data from the
page's JSON (`report-data`) and draws them with Chart.js; every string the job chose reaches it
as JSON and is drawn on a canvas, never written into the page as markup."""

from __future__ import annotations

STYLE = """
:root { --ink: #1d2330; --muted: #5d6678; --line: #dde1e8; --panel: #ffffff; --page: #f3f5f8;
  --accent: #2f6fdb; --bad: #c62828; --bad-bg: #fdecea; --good: #2e7d32; --good-bg: #e8f5e9;
  --warn: #8a5a00; --warn-bg: #fff4e0; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--page); color: var(--ink);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1240px; margin: 0 auto; padding: 20px 24px 40px; }
header h1 { font-size: 22px; margin: 0 0 2px; }
header .command { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: 13px; color: var(--muted); word-break: break-all; }
header .meta { color: var(--muted); font-size: 12px; margin-top: 4px; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
section { background: var(--panel); border: 1px solid var(--line); border-radius: 8px;
  padding: 14px 18px 16px; margin-top: 16px; min-width: 0; }
section h2 { font-size: 16px; margin: 0 0 8px; }
section .lead { color: var(--muted); margin: 0 0 10px; font-size: 13px; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(520px, 100%), 1fr)); gap: 0 16px; }
.grid > div { min-width: 0; }
@media (max-width: 700px) { .grid { grid-template-columns: 1fr; } main { padding: 12px; } }
.banner { border-radius: 8px; padding: 12px 16px; margin-top: 16px; border: 1px solid; }
.banner h2 { font-size: 16px; margin: 0 0 4px; }
.banner p { margin: 4px 0 0; }
.banner.bad { background: var(--bad-bg); border-color: #f2b8b5; color: #5f1212; }
.banner.good { background: var(--good-bg); border-color: #b7dcb9; color: #173d19; }
.banner.warn { background: var(--warn-bg); border-color: #f0d39b; color: #4d3300; }
.banner pre { white-space: pre-wrap; word-break: break-word; margin: 8px 0 0; max-height: 360px;
  overflow: auto; background: rgba(255,255,255,.6); padding: 8px; border-radius: 6px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; word-break: break-all; }
.chart { position: relative; height: 260px; width: 100%; }
.chart.tall { height: 340px; }
.figures { display: flex; flex-wrap: wrap; gap: 6px 22px; margin: 0 0 10px; }
.figures div { font-size: 13px; color: var(--muted); }
.figures b { color: var(--ink); font-size: 15px; font-weight: 600; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th { text-align: left; color: var(--muted); font-weight: 600; border-bottom: 1px solid var(--line);
  padding: 5px 8px; white-space: nowrap; }
td { border-bottom: 1px solid #eef0f4; padding: 4px 8px; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.name { word-break: break-all; }
details.thread { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0; }
details.thread > summary { cursor: pointer; padding: 7px 10px; display: flex; flex-wrap: wrap;
  gap: 4px 12px; align-items: baseline; list-style-position: inside; }
details.thread[open] > summary { border-bottom: 1px solid var(--line); background: #f8f9fb; }
.thread .tname { font-weight: 600; word-break: break-all; }
.thread .where { color: var(--muted); font-size: 12.5px; word-break: break-all; }
.pill { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px;
  background: #e8eefc; color: #21457e; white-space: nowrap; }
.pill.bad { background: var(--bad-bg); color: var(--bad); }
.pill.good { background: var(--good-bg); color: var(--good); }
.pill.quiet { background: #eef0f4; color: var(--muted); }
ol.frames { list-style: none; margin: 0; padding: 6px 10px 8px; }
ol.frames li { padding: 2px 0; }
ol.frames .func { font-weight: 600; }
ol.frames .file { color: var(--muted); word-break: break-all; }
ol.frames .code { display: block; white-space: pre-wrap; word-break: break-word; color: #334;
  padding-left: 18px; }
ol.frames li.native .func { font-weight: 400; color: var(--muted); }
ul.left-out { margin: 6px 0 0; padding-left: 20px; color: var(--muted); }
p.left-out, p.others, div.per-rank { color: var(--muted); margin: 6px 10px; font-size: 12.5px; }
ol.frames li.elided { color: var(--muted); font-style: italic; }
/* Text the job chose (names, argv, paths, code) is isolated: a right-to-left override in it
   cannot reorder what is drawn around it. */
.tname, .where, .file, .code, .func, .command, dd, td.name, p.others, div.per-rank { unicode-bidi: isolate; }
footer { color: var(--muted); font-size: 12px; margin-top: 18px; }
footer ul { padding-left: 18px; }
"""

# Chart.js's defaults and the axes' units, for the single report's charts and the job page's.
CHART_PRELUDE = """
  Chart.defaults.animation = false;
  Chart.defaults.font.family = 'system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif';
  Chart.defaults.color = '#5d6678';
  Chart.defaults.maintainAspectRatio = false;
  const seconds = v => v >= 1 ? v.toFixed(2) + ' s' : (v * 1000).toFixed(v >= 0.01 ? 0 : 1) + ' ms';
  const mb = v => v >= 1024 ? (v / 1024).toFixed(2) + ' GB' : v.toFixed(v >= 100 ? 0 : 1) + ' MB';
  const ago = v => { const s = -v; if (s < 0.05) return 'now';
    if (s < 10) return '-' + s.toFixed(1) + ' s';
    if (s < 120) return '-' + s.toFixed(0) + ' s';
    if (s < 7200) return '-' + (s / 60).toFixed(0) + ' min';
    return '-' + (s / 3600).toFixed(1) + ' h'; };
  const canvas = id => document.getElementById(id);
"""

# Chart.js draws on canvas: labels and tooltips are painted text, never parsed as HTML.
SCRIPT = (
    """
(() => {
  const data = JSON.parse(document.getElementById('report-data').textContent);
  const blue = '#2f6fdb', orange = '#e8833a', green = '#3a9d5d', red = '#c62828', purple = '#7b4fc9';
"""
    + CHART_PRELUDE
    + """

  if (canvas('chart-steps') && data.steps.length) {
    const nanSteps = new Set(data.nan_steps);
    // Step time (start to next start) when there is one; else the one step's traced calls.
    const paced = data.steps.some(s => s.seconds !== null);
    const points = data.steps.filter(s => (paced ? s.seconds : s.traced_s) !== null)
      .map(s => ({x: s.step, y: paced ? s.seconds : s.traced_s}));
    const traced = paced
      ? data.steps.filter(s => s.traced_s !== null).map(s => ({x: s.step, y: s.traced_s})) : [];
    // Every step after the first bad one is often bad too: then only where it began is marked.
    const bad = points.filter(p => nanSteps.has(p.x));
    const marks = bad.length > 30 ? bad.slice(0, 1) : bad;
    new Chart(canvas('chart-steps'), {
      type: 'line',
      data: {datasets: [
        {label: paced ? 'step time' : 'in traced calls', data: points, borderColor: blue,
         backgroundColor: 'rgba(47,111,219,.12)',
         fill: true, pointRadius: points.length > 60 ? 0 : 2.5, borderWidth: 1.6, tension: 0},
        {label: 'in traced calls', data: traced, borderColor: orange, backgroundColor: orange,
         pointRadius: traced.length > 60 ? 0 : 2, borderWidth: 1.2, borderDash: [4, 3], tension: 0},
        {label: bad.length > 30 ? 'first NaN/Inf' : 'NaN/Inf seen', data: marks, type: 'scatter',
         borderColor: red, backgroundColor: red,
         pointStyle: 'triangle', pointRadius: 6, showLine: false},
      ].filter(set => set.data.length > 0)},
      options: {scales: {x: {type: 'linear', title: {display: true, text: 'step'},
                              ticks: {precision: 0}},
                         y: {beginAtZero: true, title: {display: true, text: 'seconds'},
                             ticks: {callback: v => seconds(v)}}},
                plugins: {legend: {display: marks.length > 0 || traced.length > 0},
                          tooltip: {callbacks: {label: c => c.dataset.label + ': ' + seconds(c.parsed.y)}}}},
    });
  }

  if (canvas('chart-modules') && data.modules.length) {
    const stage = (label, key, color) => ({label: label, data: data.modules.map(m => m[key]),
                                          backgroundColor: color, stack: 'per step'});
    const sets = [stage('forward', 'forward_s', blue), stage('backward', 'backward_s', orange),
                  stage('optimizer', 'optimizer_s', green)]
      .filter(set => set.data.some(v => v > 0));
    new Chart(canvas('chart-modules'), {
      type: 'bar',
      data: {labels: data.modules.map(m => m.module), datasets: sets},
      options: {indexAxis: 'y',
                scales: {x: {stacked: true, beginAtZero: true, ticks: {callback: v => seconds(v)},
                             title: {display: true, text: 'mean time per step'}},
                         y: {stacked: true, ticks: {autoSkip: false,
                             callback: function (v) { const l = this.getLabelForValue(v);
                               return l.length > 36 ? '\\u2026' + l.slice(-35) : l; }}}},
                plugins: {tooltip: {callbacks: {label: c => c.dataset.label + ': ' + seconds(c.parsed.x)}}}},
    });
  }

  const memory = data.memory;
  const last = memory.length ? memory[memory.length - 1].ts : 0;
  const first = memory.length ? memory[0].ts - last : 0;
  const line = (id, sets, format, title) => {
    if (!canvas(id)) return;
    new Chart(canvas(id), {
      type: 'line',
      data: {datasets: sets.map(([label, key, color]) => ({
        label: label, borderColor: color, backgroundColor: color, borderWidth: 1.6, spanGaps: true,
        data: memory.filter(m => m[key] !== null).map(m => ({x: m.ts - last, y: m[key]})),
      })).map(set => Object.assign(set, {pointRadius: set.data.length > 40 ? 0 : 2.5}))},
      options: {scales: {x: {type: 'linear', min: Math.min(first, -1), max: 0,
                             ticks: {callback: v => ago(v), maxTicksLimit: 8},
                             title: {display: true, text: 'before the last sample'}},
                         y: {beginAtZero: true, title: {display: true, text: title},
                             ticks: {callback: v => format(v)}}},
                interaction: {mode: 'nearest', axis: 'x', intersect: false},
                plugins: {legend: {display: sets.length > 1},
                          tooltip: {callbacks: {title: items => ago(items[0].parsed.x),
                                    label: c => c.dataset.label + ': ' + format(c.parsed.y)}}}},
    });
  };
  line('chart-rss', [['RSS', 'rss_mb', blue]], mb, 'resident memory');
  line('chart-cuda', [['allocated', 'cuda_allocated_mb', purple], ['reserved', 'cuda_reserved_mb', orange]],
       mb, 'CUDA memory');
  line('chart-gc', [['gc objects', 'gc_objects', green]], v => v.toLocaleString('en'), 'objects');
})();
"""
)
