"""`probing run --hang-timeout S`: end a CI job that stopped progressing, with every stack.

Progress is a change in the main thread's stack (of the job, or of its first Python
descendant when the job is a shell script). After S seconds without one, the watchdog
prints the backtrace of the whole process tree to stderr (each stuck thread with the
locals of its innermost frame), writes the JSON report when asked, terminates the tree
(SIGTERM, then SIGKILL after 5 s) and makes `probing run` exit 11.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from ..analysis.progress import ProgressTracker, take_sample
from ..cli import render
from ..errors import ExitCode, ProbingError


class Watchdog:
    def __init__(self, pid: int, timeout: float, report: Optional[str], context: Any) -> None:
        self.pid = pid
        self.timeout = timeout
        self.report = report
        self.context = context
        self.interval = min(max(timeout / 10, 0.2), 5.0)
        self.tracker: Optional[ProgressTracker] = None

    def _python_pid(self) -> int:
        from ..client.discovery import python_version_of

        try:
            if python_version_of(self.pid) is not None:
                return self.pid
        except ProbingError:
            return self.pid
        from ..cli.actions import _descendants

        for child, _ in _descendants(self.pid):
            try:
                if python_version_of(child) is not None:
                    return child
            except ProbingError:
                continue
        return self.pid

    def _sample(self, pid: int, with_locals: bool = False) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        from ..cli.actions import Context, _one_process

        context = Context(str(pid), self.context.verbose, True, 5.0)
        rows, info, _ = _one_process(context, with_locals, None, 2.0, False)
        return rows, info

    def tick(self) -> Optional[int]:
        pid = self._python_pid()
        try:
            rows, info = self._sample(pid)
        except ProbingError:
            return None  # not started yet, or between processes: no verdict
        if self.tracker is None or self.tracker.pid != pid:
            self.tracker = ProgressTracker(pid, lambda frame: "")
        report = self.tracker.add(take_sample(pid, rows, info))
        stalled = self.tracker.stalled_s(time.monotonic())
        if not report.hung or stalled < self.timeout:
            return None
        self._dump_and_end(stalled)
        return ExitCode.HUNG

    def _dump_and_end(self, stalled: float) -> None:
        from ..cli.actions import _descendants

        sys.stderr.write(
            f"probing: the job made no progress for {stalled:.0f} s (its main thread's stack did not "
            "change); every stack of its process tree follows, then it is ended\n"
        )
        tree = [self.pid] + [child for child, _ in _descendants(self.pid)]
        reports = []
        for pid in tree:
            try:
                rows, info = self._sample(pid, with_locals=True)
            except ProbingError as error:
                sys.stderr.write(f"\nprobing: PID {pid}: {render.inert(error.message)}\n")
                continue
            # Locals of the innermost frame of each thread only: what it is stuck on.
            rows = [dict(row, locals=row["locals"] if row["depth"] == 0 else None) for row in rows]
            sys.stderr.write("\n")
            render.write_backtrace_text(rows, info, sys.stderr, pid, info.get("outside"))
            reports.append({"pid": pid, "frames": rows})
        sys.stderr.flush()
        if self.report:
            with open(self.report, "w") as handle:
                json.dump(
                    {"hung": True, "stalled_s": round(stalled, 1), "processes": reports}, handle, indent=2
                )
        self._end(tree)

    @staticmethod
    def _end(tree: List[int]) -> None:
        for pid in reversed(tree):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in tree[1:]):
            time.sleep(0.05)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
