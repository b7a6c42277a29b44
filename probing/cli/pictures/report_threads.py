"""The report page's Threads section: one <details> per thread (or per group of threads with
the same stack), most recent call last, the main thread first and open."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List

from .page import text
from .report_parts import seconds, section

if TYPE_CHECKING:
    from ...engine.report.live import Report


def _state_pill(state: str) -> str:
    kind = "bad" if "GIL" in state or "died" in state else "quiet" if "wait" in state else ""
    return f'<span class="pill {kind}">{text(state)}</span>'


def thread_html(thread: Dict[str, Any]) -> str:
    """One entry of report_threads (or report_job's, across ranks) as a <details>."""
    frames = []
    for frame in reversed(thread["frames"]):  # most recent call last, as a traceback reads
        if frame.get("elided"):
            frames.append(f'<li class="elided">… {text(frame["elided"])} frames left out …</li>')
            continue
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
    if thread.get("count", 1) > 1:
        extra.append(f'<span class="pill">same stack on {thread["count"]:,} threads</span>')
    if thread.get("daemon"):
        extra.append('<span class="pill quiet">daemon</span>')
    per_rank = thread.get("per_rank") or []
    if thread.get("cpu_s") is not None and len(per_rank) < 2:
        extra.append(f'<span class="where">CPU {text(seconds(thread["cpu_s"]))}</span>')
    # The main thread, and a thread holding the GIL (it stops every other): their stacks matter first.
    opened = " open" if thread.get("is_main") or "GIL" in str(thread.get("state")) else ""
    ids = f"thread {thread.get('thread_id')}, native {thread.get('native_id')}" if len(per_rank) < 2 else ""
    return (
        f'<details class="thread"{opened}><summary><span class="tname">{text(thread.get("name"))}</span>'
        f"{_state_pill(thread.get('state') or '')}{''.join(extra)}"
        f'<span class="where">{text(thread.get("where"))}{text(" · " + ids if ids else "")}</span></summary>'
        f"{_others(thread)}{_per_rank(per_rank)}"
        f'<ol class="frames">{"".join(frames)}</ol></details>'
    )


# A stack on many ranks lists the ids of so many of them, then counts the rest.
PER_RANK_LISTED = 8


def _per_rank(per_rank: List[Dict[str, Any]]) -> str:
    """A stack shared by several ranks (report --ranks): each rank's thread ids and CPU time."""
    if len(per_rank) < 2:
        return ""
    parts = []
    for own in per_rank[:PER_RANK_LISTED]:
        cpu = f", CPU {seconds(own['cpu_s'])}" if own.get("cpu_s") is not None else ""
        parts.append(f"rank {own['rank']}: thread {own.get('thread_id')}, native {own.get('native_id')}{cpu}")
    more = len(per_rank) - PER_RANK_LISTED
    if more > 0:
        parts.append(f"{more} more {'rank' if more == 1 else 'ranks'}")
    return f'<div class="per-rank">{text("; ".join(parts))}</div>'


def _others(thread: Dict[str, Any]) -> str:
    others = thread.get("others") or []
    if not others:
        return ""
    more = thread["count"] - 1 - len(others)
    names = ", ".join(str(name) for name in others) + (f" and {more:,} more" if more > 0 else "")
    return f'<p class="others">Also: {text(names)}</p>'


def threads_section(report: Report) -> str:
    if not report.threads:
        return ""
    source = {"agent": "read by the agent", "py-spy": "read from outside the process (py-spy)",
              "record": "as the record holds them"}[report.stacks_source]  # fmt: skip
    count = report.thread_count or len(report.threads)
    lead = f"{count:,} threads, {source}; the main thread first. Most recent call last."
    if len(report.threads) < count:
        lead += " Threads with the same stack and state are drawn once."
    tail = ""
    if report.threads_left_out:
        tail = (
            f'<p class="left-out">{report.threads_left_out:,} more threads are not drawn: '
            f"the page holds at most {len(report.threads)} stacks "
            "(`probing PID backtrace` lists them all).</p>"
        )
    return section(
        "threads", "Threads", text(lead), "".join(thread_html(thread) for thread in report.threads) + tail
    )
