"""What one CLI command costs: wall time, exit code, output, descriptors, and peak RSS, read by
GNU time (`%M`: the command's ru_maxrss, which covers what it waited for: nsenter's child, the
CLI). Not os.wait4 on a child of this process: Linux keeps the RSS high-water mark of the memory
a process had before exec, and a child forked from a harness that imported torch starts at 200 MB.
And what a rank costs: PSS from /proc/PID/smaps_rollup, the honest figure for pages shared with
the zygote and the other ranks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from typing import Dict, List, NamedTuple, Optional


class Measured(NamedTuple):
    seconds: float
    peak_rss_mb: float
    returncode: int
    stdout: str
    stderr: str
    peak_fds: int  # sampled every FD_SAMPLE_S: the CLI's descriptors at their most


FD_SAMPLE_S = 0.05
TIME = "/usr/bin/time"


def measure(argv: List[str], env: Dict[str, str], timeout: float) -> Measured:
    """Run `argv` to its end (killed, with its process group, at `timeout`)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as rss:  # fmt: skip
        timed = [TIME, "-f", "%M", "-o", rss.name, *argv]
        started = time.perf_counter()
        process = subprocess.Popen(timed, stdout=out, stderr=err, env=env, start_new_session=True)
        ended: List[tuple] = []  # type: ignore[type-arg]
        waiter = threading.Thread(target=lambda: ended.append(os.wait4(process.pid, 0)), daemon=True)
        waiter.start()
        peak_fds, deadline = 0, started + timeout
        while waiter.is_alive() and time.perf_counter() < deadline:
            peak_fds = max(peak_fds, count_fds(process.pid))
            waiter.join(FD_SAMPLE_S)
        if not ended:
            os.killpg(process.pid, signal.SIGKILL)
            waiter.join(30)
        seconds = time.perf_counter() - started
        _, status, _ = ended[0]
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        kilobytes = rss.read().split()
        peak_mb = int(kilobytes[-1]) / 1024 if kilobytes and kilobytes[-1].isdigit() else float("nan")
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        return Measured(seconds, peak_mb, process.returncode, stdout, stderr, peak_fds)


def _rollup(pid: int) -> Optional[Dict[str, int]]:
    """kB figures of /proc/PID/smaps_rollup (Rss, Pss, Private_Dirty, ...); None when gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            lines = handle.read().splitlines()[1:]
    except OSError:
        return None
    figures = {}
    for line in lines:
        name, _, rest = line.partition(":")
        words = rest.split()
        if words and words[0].isdigit():
            figures[name] = int(words[0])
    return figures


class MemoryOfRanks(NamedTuple):
    ranks: int
    pss_mb_per_rank: float
    rss_mb_per_rank: float
    private_mb_per_rank: float
    zygote_pss_mb: float  # one per node, the pages every rank shares counted in part here
    total_pss_mb: float


def memory_of_ranks(rank_pids: List[int], zygote_pids: List[int]) -> MemoryOfRanks:
    ranks = [figures for figures in map(_rollup, rank_pids) if figures]
    zygotes = [figures for figures in map(_rollup, zygote_pids) if figures]

    def mean(name: str) -> float:
        return sum(figures.get(name, 0) for figures in ranks) / max(1, len(ranks)) / 1024

    private = sum(f.get("Private_Dirty", 0) + f.get("Private_Clean", 0) for f in ranks) / max(1, len(ranks))
    zygote_pss = sum(figures.get("Pss", 0) for figures in zygotes) / max(1, len(zygotes)) / 1024
    total = (sum(f.get("Pss", 0) for f in ranks) + sum(f.get("Pss", 0) for f in zygotes)) / 1024
    return MemoryOfRanks(len(ranks), mean("Pss"), mean("Rss"), private / 1024, zygote_pss, total)


def children(pid: int) -> List[int]:
    """Children of `pid` as this side's /proc numbers them (every thread's children)."""
    found: List[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found.extend(int(word) for word in handle.read().split())
    except OSError:
        pass
    return found


def descendants(pid: int) -> List[int]:
    """`pid` and every process under it (bounded: 64 processes' children read)."""
    found, index = [pid], 0
    while index < len(found) and index < 64:
        found.extend(children(found[index]))
        index += 1
    return found


def count_fds(pid: int) -> int:
    """Open descriptors of `pid` and its descendants."""
    total = 0
    for each in descendants(pid):
        try:
            total += len(os.listdir(f"/proc/{each}/fd"))
        except OSError:
            pass
    return total
