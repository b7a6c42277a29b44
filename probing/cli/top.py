"""`probing PID top`: a live view of a process (a line per thread) or of a job (a line per rank),
refreshed until `q`; plain frames, one after another, where stdout is not a terminal."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from typing import Any, Callable, Iterator, Optional

import click

from .invocation import Invocation
from .options import apply, pass_invocation
from .spec import RANKS, timeout

QUIT_KEYS = (b"q", b"Q")


@click.command()
@click.option(
    "--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True, metavar="S",
    help="Seconds between refreshes.",
)  # fmt: skip
@click.option(
    "--count", type=click.IntRange(min=0), default=0, metavar="N",
    help="Stop after N refreshes (default: until q, or Ctrl-C).",
)  # fmt: skip
@apply(timeout(2.0, "Seconds each refresh waits for an agent before reading its stacks from outside."), RANKS)
@pass_invocation
def top(invocation: Invocation, interval: float, count: int, timeout: float, ranks: Optional[str]) -> int:
    """A live view: each thread's CPU, state and where it is, refreshed every second; with
    --ranks, a line per rank (CPU, RSS, its collectives enqueued and completed, what its main
    thread does), the rank furthest behind first. `q` quits.

    Each refresh costs the job what a `backtrace` does (with --ranks, a fifth more: its
    collectives' progress is read one refresh in five). On a terminal the screen is redrawn in
    place; to a pipe or a file, each refresh is printed after the last (--count to stop).
    """
    watch = invocation.kind(ranks, what="`top`").top(timeout)
    from ..engine.top import JobWatch
    from .render.top import job_screen, on_terminal, process_screen, show_frames, show_live

    def screen(interactive: bool) -> Any:
        view = watch.refresh()
        if isinstance(watch, JobWatch):
            return job_screen(view, interval, interactive)
        return process_screen(view, interval, interactive)

    if on_terminal():
        return show_live(screen, interval, count, _keys)
    return show_frames(screen, interval, count)


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], bool]]:
    """Keys read one at a time, without echo, while the screen is up; the terminal as it was
    after. Yields `quit_within(seconds)`: whether q was pressed before they passed."""
    import termios
    import tty

    descriptor = sys.stdin.fileno()
    saved = termios.tcgetattr(descriptor)
    tty.setcbreak(descriptor)

    def quit_within(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([descriptor], [], [], left)
            if ready:
                key = os.read(descriptor, 1)
                if key in QUIT_KEYS or key == b"":
                    return True

    try:
        yield quit_within
    finally:
        termios.tcsetattr(descriptor, termios.TCSADRAIN, saved)
