"""`top`'s screen: a heading and a table, drawn by rich on a terminal and as plain text (one frame
after another) for a pipe or a file."""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, ContextManager, List, NamedTuple, Optional

from ...analysis.rank_ranges import rank_runs
from ...engine.top import PROGRESS_EVERY, JobView, ProcessView
from . import inert


class Screen(NamedTuple):
    heading: List[str]
    columns: List[str]
    numeric: List[bool]  # right-aligned columns
    rows: List[List[str]]
    footer: List[str]


def _cpu(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}"


def _bytes(value: Optional[int]) -> str:
    if value is None:
        return "-"
    if value >= 10 * 2**30:
        return f"{value / 2**30:.0f} GB"
    return f"{value / 2**30:.1f} GB" if value >= 2**30 else f"{value / 2**20:.0f} MB"


def _moment(interval: float, interactive: bool) -> str:
    keys = " · q quits" if interactive else ""
    return f"{time.strftime('%H:%M:%S')} · every {interval:g} s{keys}"


def process_screen(view: ProcessView, interval: float, interactive: bool) -> Screen:
    """A line per thread, the busiest first."""
    command = view.command if len(view.command) <= 80 else view.command[:77] + "..."
    cpu = "CPU -" if view.cpu_percent is None else f"CPU {view.cpu_percent:.1f}%"
    source = "its agent" if view.source == "agent" else view.source
    heading = [
        f"PID {view.pid} · {command}" if command else f"PID {view.pid}",
        f"{cpu} · RSS {_bytes(view.rss_bytes)} · {len(view.threads)} threads · stacks from {source} · "
        + _moment(interval, interactive),
    ]
    rows = [[t.name, _cpu(t.cpu_percent), t.state, t.where] for t in view.threads]
    known = [t.cpu_percent for t in view.threads if t.cpu_percent is not None]
    if view.cpu_percent is not None and known and view.cpu_percent - sum(known) >= 1.0:
        # torch's intra-op pool and other native threads (probing's own too) run no Python.
        rest = _cpu(view.cpu_percent - sum(known))
        rows.append(["(other threads)", rest, "no Python: torch's and libraries' own, probing's", "-"])
    footer = list(view.notes)
    return Screen(heading, ["THREAD", "CPU%", "STATE", "WHERE"], [False, True, False, False], rows, footer)


def job_screen(view: JobView, interval: float, interactive: bool) -> Screen:
    """A line per rank, the one furthest behind first."""
    nodes = len({line.node for line in view.ranks})
    name = view.job.run_id or (f"torchrun {view.job.launcher}" if view.job.launcher else "job")
    where = f"{nodes} node{'s' * (nodes != 1)}"
    heading = [
        f"job {name} · {len(view.ranks)} of its {view.job.world_size} ranks on {where}",
        _moment(interval, interactive),
    ]
    rows = []
    for line in view.ranks:
        progress = (
            "-"
            if line.enqueued is None
            else f"#{line.enqueued} / #{line.completed if line.completed is not None else '?'}"
        )
        rows.append([
            str(line.rank), "-" if line.node is None else str(line.node), str(line.pid),
            _cpu(line.cpu_percent), _bytes(line.rss_bytes), progress, _cpu(line.rate),
            line.state or f"[not looked at: {line.error}]",
        ])  # fmt: skip
    behind = [line.rank for line in view.ranks if _is_behind(line, view)]
    footer = [
        f"COLLECTIVE: its default group's last collective enqueued / completed, COLL/S: enqueued a "
        f"second (read every {PROGRESS_EVERY} refreshes); the rank furthest behind first"
        + (f"; behind the others: rank {rank_runs(behind, 3)}" if behind else ""),
    ]
    columns = ["RANK", "NODE", "PID", "CPU%", "RSS", "COLLECTIVE", "COLL/S", "STATE / WHERE"]
    return Screen(heading, columns, [True, True, True, True, True, False, True, False], rows, footer)


def _is_behind(line: Any, view: JobView) -> bool:
    known = [other.enqueued for other in view.ranks if other.enqueued is not None]
    return line.enqueued is not None and len(known) > 1 and line.enqueued < max(known)


def _widths(screen: Screen) -> List[int]:
    """Each column's widest cell, its name included."""
    return [
        max(len(row[index]) for row in [screen.columns, *screen.rows]) for index in range(len(screen.columns))
    ]


def plain(screen: Screen, width: Optional[int] = None) -> str:
    """The screen as text: columns padded to their widest cell, each line cut to `width`. What
    the job named (threads, files, its command line) is made inert: no escape acts on a terminal."""
    screen = Screen(
        [inert(line) for line in screen.heading], screen.columns, screen.numeric,
        [[inert(cell) for cell in row] for row in screen.rows], [inert(line) for line in screen.footer],
    )  # fmt: skip
    table = [screen.columns, *screen.rows]
    widths = _widths(screen)
    lines = list(screen.heading) + [""]
    for row in table:
        cells = [
            cell.rjust(size) if right else cell.ljust(size)
            for cell, size, right in zip(row, widths, screen.numeric)
        ]  # fmt: skip
        lines.append("  ".join(cells).rstrip())
    lines.extend(["", *screen.footer] if screen.footer else [])
    if width:
        lines = [line if len(line) <= width else line[: width - 3] + "..." for line in lines]
    return "\n".join(lines)


def drawn(screen: Screen, width: int) -> Any:
    """The screen as rich draws it on a terminal `width` columns wide: the plain text, its
    heading bold and the table's header reversed (rich is imported here, on a terminal only)."""
    from rich.text import Text

    text = Text(no_wrap=True, overflow="ellipsis")
    header = len(screen.heading) + 1
    for index, line in enumerate(plain(screen, width).split("\n")):
        style = (
            "bold"
            if index == 0
            else "reverse"
            if index == header
            else "dim"
            if index > header + len(screen.rows)
            else ""
        )
        text.append(line + "\n", style=style)
    return text


# --- the loops that show them ----------------------------------------------------------------

Refresh = Callable[[bool], Screen]  # a new screen, for a terminal (True) or not


def on_terminal() -> bool:
    """Whether the screen is drawn in place: stdout and stdin (for the keys) are a terminal."""
    return sys.stdout.isatty() and sys.stdin.isatty()


def show_frames(refresh: Refresh, interval: float, count: int) -> int:
    """Refreshes printed one after another, a blank line between them; 0 after `count`."""
    shown = 0
    while True:
        started = time.monotonic()
        text = plain(refresh(False))
        sys.stdout.write(("\n" if shown else "") + text + "\n")
        sys.stdout.flush()
        shown += 1
        if count and shown >= count:
            return 0
        time.sleep(max(0.0, started + interval - time.monotonic()))


def show_live(refresh: Refresh, interval: float, count: int, keys: Callable[[], ContextManager[Any]]) -> int:
    """The screen redrawn in place (the terminal's alternate screen, as top's) until `keys()`'s
    `quit_within(seconds)` says q was pressed, Ctrl-C, or `count` refreshes; 0."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    first = drawn(
        refresh(True), console.width
    )  # a target that cannot be looked at fails here, before the screen
    shown = 1
    with keys() as quit_within, Live(first, console=console, screen=True, auto_refresh=False) as live:
        try:
            while not (count and shown >= count):
                if quit_within(interval):
                    break
                live.update(drawn(refresh(True), console.width), refresh=True)
                shown += 1
        except KeyboardInterrupt:
            pass
    return 0
