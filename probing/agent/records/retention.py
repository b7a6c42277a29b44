"""Which records a directory keeps, and the log of those it let go.

A record directory is shared: by every job of a user on the machine (the default one is per
uid), by the ranks of a job, by the jobs of a sweep. A bound on the directory alone (the newest
N records, whoever wrote them) lets a chatty job (a cron of `probing PID record`, a job that
survives its SIGHUPs, a sweep of short runs) push out another job's only record of the incident
someone will ask about tomorrow. So the bounds are, in order:

1. per job: the newest PROBING_RECORD_KEEP records of each job (its stem: the script's name,
   as record names start with it; the ranks of one job share it);
2. per directory, in files (PROBING_RECORD_TOTAL_FILES) and in bytes (PROBING_RECORD_TOTAL_MB):
   while over either, the oldest record of the job with the most records (files) or the most
   bytes (size) goes, so a job with one record loses it only when every job is down to one.

The record just written is never removed (a directory over its bounds with it alone keeps it).
`.fatal` files of processes that are gone count as their job's records; a live process's is its
armed fault handler and is never touched. Every removal is appended to the directory's pruned
log (protocol.records.PRUNED_LOG, one JSON object a line, rotated once over PRUNED_LOG_BYTES),
which `probing records` reads to say what went and why.

Runs in a dying job after its record is written: file names and lstat only, no record is opened.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

from ...originals import json_dumps, wall_time
from ...protocol.records import PRUNED_LOG, PRUNED_LOG_OLDER, SUFFIX

DEFAULT_KEEP = 20
DEFAULT_TOTAL_FILES = 200
DEFAULT_TOTAL_MB = 1024.0
FATAL_SUFFIX = ".fatal"
# A record's temporary file this old was left by a write that was cut (SIGKILL): removed.
STALE_TEMPORARY_S = 3600.0
# The pruned log is rotated (to PRUNED_LOG_OLDER) once it is this big: the two keep a few
# hundred removals, and a reader never reads more than twice this.
PRUNED_LOG_BYTES = 64 << 10
# <stem>-<pid>-<YYYYmmdd-HHMMSS>[-N].probing, <stem>-<pid>.fatal and, renamed once the process was
# gone, <stem>-<pid>-<epoch seconds>.fatal (a PID has at most 7 digits: pid_max is 2**22).
_RECORD_NAME = re.compile(r"^(?P<stem>.+)-(?P<pid>[0-9]+)-[0-9]{8}-[0-9]{6}(?:-[0-9]+)?\.probing$")
_FATAL_NAME = re.compile(r"^(?P<stem>.+)-(?P<pid>[0-9]{1,7})(?:-(?P<renamed>[0-9]{8,}))?\.fatal$")


class Retention(NamedTuple):
    """The bounds of a record directory (see the module's doc)."""

    keep_per_job: int
    total_files: int
    total_bytes: int


class Candidate(NamedTuple):
    mtime: float
    name: str
    path: str
    size: int
    job: str


def _number(env: Mapping[str, str], name: str, default: float, smallest: float) -> float:
    try:
        value = float(env.get(name, "") or default)
    except ValueError:
        return default
    return max(smallest, value) if value == value else default  # NaN: the default


def retention(environ: Optional[Mapping[str, str]] = None) -> Retention:
    """PROBING_RECORD_KEEP (per job, at least 1), PROBING_RECORD_TOTAL_FILES (at least 1) and
    PROBING_RECORD_TOTAL_MB (per directory); a value that is not a number leaves the default."""
    env = os.environ if environ is None else environ
    keep = int(_number(env, "PROBING_RECORD_KEEP", DEFAULT_KEEP, 1))
    files = int(_number(env, "PROBING_RECORD_TOTAL_FILES", DEFAULT_TOTAL_FILES, 1))
    megabytes = _number(env, "PROBING_RECORD_TOTAL_MB", DEFAULT_TOTAL_MB, 0)
    return Retention(keep, files, int(min(megabytes, 1 << 40) * (1 << 20)))


def job_of(name: str) -> str:
    """The job a record or .fatal file name belongs to: its stem; a name of another shape is a
    job of its own."""
    match = _RECORD_NAME.match(name) or _FATAL_NAME.match(name)
    return match.group("stem") if match is not None else name


def _pid_of_fatal(name: str) -> Optional[int]:
    """The PID of a `.fatal` file still named for a process that may run (a renamed one: None)."""
    match = _FATAL_NAME.match(name)
    if match is None or match.group("renamed"):
        return None
    return int(match.group("pid"))


def _alive(pid: Optional[int]) -> bool:
    return pid is not None and os.path.exists(f"/proc/{pid}")


def _candidates(directory: str, names: List[str], uid: int) -> List[Candidate]:
    """This uid's records and `.fatal` files of gone processes, as regular files."""
    found = []
    for name in names:
        if name.startswith(".") or not name.endswith((SUFFIX, FATAL_SUFFIX)):
            continue
        path = os.path.join(directory, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            continue
        if name.endswith(FATAL_SUFFIX) and _alive(_pid_of_fatal(name)):
            continue  # armed for a running process
        found.append(Candidate(info.st_mtime, name, path, info.st_size, job_of(name)))
    return found


def choose(candidates: List[Candidate], bounds: Retention, written: str = "") -> List[Tuple[Candidate, str]]:
    """What to remove, and why, so that `candidates` keep within `bounds`; never `written`."""
    by_job: Dict[str, List[Candidate]] = {}
    for candidate in sorted(candidates, reverse=True):  # newest first
        by_job.setdefault(candidate.job, []).append(candidate)
    chosen: List[Tuple[Candidate, str]] = []
    for job, records in by_job.items():
        removable = [record for record in records[bounds.keep_per_job :] if record.path != written]
        for record in removable:
            chosen.append((record, (
                f"job {job!r} had {len(records)} records; PROBING_RECORD_KEEP={bounds.keep_per_job} "
                f"keeps the newest {bounds.keep_per_job} of each job"
            )))  # fmt: skip
        by_job[job] = [record for record in records if record not in removable]
    files = sum(len(records) for records in by_job.values())
    size = sum(record.size for records in by_job.values() for record in records)
    while files > bounds.total_files or size > bounds.total_bytes:
        over_files = files > bounds.total_files
        jobs = [job for job, records in by_job.items() if any(record.path != written for record in records)]
        if not jobs:
            break
        job = max(jobs, key=lambda name: _weight(by_job[name], over_files))
        oldest = next(record for record in reversed(by_job[job]) if record.path != written)
        if over_files:
            why = (
                f"{files} records in the directory, over PROBING_RECORD_TOTAL_FILES={bounds.total_files}: "
                f"the oldest of job {job!r}, which had the most ({len(by_job[job])})"
            )
        else:
            why = (
                f"{_megabytes(size)} of records in the directory, over PROBING_RECORD_TOTAL_MB="
                f"{_megabytes(bounds.total_bytes, False)}: the oldest of job {job!r}, which took the most "
                f"({_megabytes(sum(record.size for record in by_job[job]))})"
            )
        chosen.append((oldest, why))
        by_job[job].remove(oldest)
        files -= 1
        size -= oldest.size
    return chosen


def _weight(records: List[Candidate], by_count: bool) -> Tuple[float, float]:
    """How much a job's records weigh on the directory: their number or their bytes; the oldest
    record breaks ties (the job that has kept its records longest gives first)."""
    held = len(records) if by_count else sum(record.size for record in records)
    return (held, -records[-1].mtime if records else 0.0)


def _megabytes(size: int, unit: bool = True) -> str:
    text = f"{size / (1 << 20):.3g}"
    return f"{text} MB" if unit else text


def prune(directory: str, bounds: Retention, written: str = "") -> List[str]:
    """Remove what keeps `directory` over `bounds` (this uid's files only; never `written`, the
    record just written), and temporary files of records whose write was cut (`.NAME.PID.tmp`,
    older than STALE_TEMPORARY_S); log each record removed. The paths removed."""
    uid = os.geteuid()
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    logged = []
    now = wall_time()
    for candidate, why in choose(_candidates(directory, names, uid), bounds, written):
        if _unlink(candidate.path):
            removed.append(candidate.path)
            logged.append({
                "name": candidate.name, "job": candidate.job, "bytes": candidate.size,
                "written_at": candidate.mtime, "pruned_at": now, "by_pid": os.getpid(), "why": why,
            })  # fmt: skip
    for name in names:
        path = os.path.join(directory, name)
        if name.startswith(".") and name.endswith(".tmp") and SUFFIX + "." in name and _stale(path, uid, now):
            if _unlink(path):
                removed.append(path)
    if logged:
        log_pruned(directory, logged)
    return removed


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except OSError as error:
        return error.errno == errno.ENOENT  # another job's prune took it first: gone all the same
    return True


def _stale(path: str, uid: int, now: float) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == uid and now - info.st_mtime > STALE_TEMPORARY_S


def log_pruned(directory: str, entries: List[Dict[str, object]]) -> None:
    """Append `entries` to the directory's pruned log, one line each, in one write (O_APPEND:
    lines of jobs pruning at once do not interleave). Best effort: a log that cannot be written
    costs the listing its explanation, never the record."""
    path = os.path.join(directory, PRUNED_LOG)
    text = "".join(json_dumps(entry, compact=True) + "\n" for entry in entries).encode("ascii")
    try:
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_size > PRUNED_LOG_BYTES:
            os.rename(path, os.path.join(directory, PRUNED_LOG_OLDER))
    except OSError:
        pass  # none yet, or another job rotated it first
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
            os.write(fd, text)
    except OSError:
        pass
    finally:
        os.close(fd)
